# Pointsman: the endpoint picker (`epp`) and the simulated fleet (`modelsim`) in one image.
# The serving extras only (README.md, "Install"): shared rate limits (redis), precise prefix routing (precise:
# KV events, tokenizers) and replicas (the bus); no Envoy binary and no typed Envoy config (the stack's).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY epp ./epp
COPY scheduling ./scheduling
COPY modelsim ./modelsim
RUN pip install --no-cache-dir ".[redis,precise,replicas]"
USER 65532:65532
EXPOSE 9002 9003 9090
ENTRYPOINT ["epp"]
CMD ["serve", "--pool-name", "default"]
