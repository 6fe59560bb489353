# Pointsman: the endpoint picker (`epp`) and the simulated fleet (`modelsim`) in one image.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY epp ./epp
COPY scheduling ./scheduling
COPY modelsim ./modelsim
COPY proto ./proto
RUN pip install --no-cache-dir .
USER 65532:65532
EXPOSE 9002 9003 9090
ENTRYPOINT ["epp"]
CMD ["serve", "--pool-name", "default"]
