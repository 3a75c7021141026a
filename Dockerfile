# Training image: `docker run --gpus all IMAGE --config configs/cifar10.yaml`
# The same Python packages as CI, at the same versions: everything comes from requirements.lock (pip-compile
# output of pyproject.toml), including torch 2.14.1's CUDA 13 build, whose CUDA and cuDNN runtime libraries
# are pip packages (nvidia-*) -- so a plain Python base image is enough; the host needs an NVIDIA driver
# that supports CUDA 13 (>= 580) and the NVIDIA container toolkit for `--gpus`. x86_64 only (the lock is).
FROM python:3.11.7-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY requirements.lock ./
RUN pip install --no-cache-dir -r requirements.lock
COPY pyproject.toml README.md ./
COPY project/ project/
RUN pip install --no-cache-dir --no-deps . \
    && useradd --create-home --uid 1000 trainer \
    && mkdir -p /app/data /app/logs \
    && chown trainer:trainer /app/data /app/logs
COPY configs/ configs/

USER 1000:1000
VOLUME ["/app/data", "/app/logs"]
ENTRYPOINT ["python", "-m", "project.fit"]
CMD ["--config", "configs/mnist.yaml"]
