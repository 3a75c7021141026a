# Training image: `docker run --gpus all IMAGE --config configs/cifar10.yaml`
# Base: the official PyTorch CUDA 12.6 / cuDNN 9 runtime image; its torch 2.7.1 and torchvision satisfy
# pyproject.toml, so pip installs only Lightning and the other small dependencies on top.
FROM pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY project/ project/
RUN pip install --no-cache-dir . \
    && useradd --create-home --uid 1000 trainer \
    && mkdir -p /app/data /app/logs \
    && chown trainer:trainer /app/data /app/logs
COPY configs/ configs/

USER 1000:1000
VOLUME ["/app/data", "/app/logs"]
ENTRYPOINT ["python", "-m", "project.fit"]
CMD ["--config", "configs/mnist.yaml"]
