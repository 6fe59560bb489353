# Pointsman: the endpoint picker (`epp`) and the simulated fleet (`modelsim`) in one image.
# The serving extras only (README.md, "Install"): shared rate limits (redis), precise prefix routing (precise:
# KV events, tokenizers) and replicas (the bus); no Envoy binary and no typed Envoy config (the stack's).
FROM python:3.11-slim AS pointsman
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


# The image for GIE's conformance suite (`docker build --target conformance`): the suite runs its reference picker
# (lwepp) with no config file, and lwepp honours test-epp-endpoint-selection and echoes the served endpoint natively;
# this image does the same with the suite's unchanged arguments. Never deploy it for real traffic.
FROM pointsman AS conformance
ENV POINTSMAN_CONFORMANCE=true

# The default target: the image above without the conformance switch.
FROM pointsman
