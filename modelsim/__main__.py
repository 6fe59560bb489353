from modelsim.cli import main

raise SystemExit(main())
