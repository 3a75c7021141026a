# Training image: `docker run --gpus all IMAGE --config configs/cifar10.yaml` (README: Clusters)
# Debian bookworm with Debian's own Python 3.11 in a virtual environment first on PATH, and the project's
# runtime packages at exactly the versions of requirements.lock (pip-compile output of pyproject.toml, the
# file CI installs), including torch 2.14.1's CUDA 13 build, whose CUDA and cuDNN runtime libraries are pip
# packages (nvidia-*): the host needs an NVIDIA driver that supports CUDA 13 (>= 580) and the NVIDIA container
# toolkit for `--gpus`. x86_64 only (the lock is). Only the product goes in (.dockerignore): no tests, no
# scripts, no benchmarks, no test tools.
# BASE: any Debian bookworm root file system. `docker build .` takes Debian's published bookworm-slim; CI
# (.ci/image) passes one it built itself with debootstrap (no registry needed).
ARG BASE=debian:bookworm-slim
FROM ${BASE}
ARG BASE

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# ca-certificates: downloads from inside the container (torchvision's data sets) need them; it follows
# bookworm's updates rather than a pinned version. g++ and python3-dev: `--model.compile true` (torch.compile's
# inductor builds C++ kernels with them on CPU, and its launchers on GPU). tini: the container's PID 1 (below).
# apt's lists and downloaded packages are removed in the same layer.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3=3.11.2-1+b1 python3-venv=3.11.2-1+b1 \
        python3-dev=3.11.2-1+b1 g++ ca-certificates tini \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/cache/debconf/*-old /var/log/apt /var/log/dpkg.log \
    && python3 -m venv "$VIRTUAL_ENV" \
    && useradd --create-home --uid 1000 trainer

WORKDIR /app
# PIP_CONFIG_FILE: a pip configuration for these build steps only (CI passes its machine's index settings).
ARG PIP_CONFIG_FILE
COPY requirements.lock pyproject.toml deploy/docker/runtime_lock.py ./
# The runtime dependencies of pyproject.toml and its `postgres` extra (a sweep's shared study:
# --storage postgresql+psycopg2://...), not the test extra, each at its locked version and each file checked against
# the lock's sha256 hashes: pip resolves which of the lock's packages they need (a dry run, the lock's pins as
# constraints: with the hashes in, Debian's pip 23 would ask the requirements themselves to be pinned),
# runtime_lock.py takes those pins with their hashes out of the lock, and pip installs exactly them with
# --require-hashes --no-deps (a file whose hash the lock does not list is refused). This layer changes only with the
# lock or pyproject.toml; a code change rebuilds the small layers below it only.
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(['pip', 'setuptools'] + p['dependencies'] + p['optional-dependencies']['postgres']))" \
        > /tmp/requirements.in \
    && sed -e '/--hash=/d' -e 's/ \\$//' requirements.lock > /tmp/constraints.txt \
    && pip install --no-cache-dir --dry-run --ignore-installed --quiet --report /tmp/resolved.json \
        -c /tmp/constraints.txt -r /tmp/requirements.in \
    && python runtime_lock.py requirements.lock /tmp/resolved.json > /tmp/runtime.lock \
    && pip install --no-cache-dir --require-hashes --no-deps -r /tmp/runtime.lock \
    && rm /tmp/requirements.in /tmp/constraints.txt /tmp/resolved.json /tmp/runtime.lock runtime_lock.py
COPY README.md ./
COPY project/ project/
RUN pip install --no-cache-dir --no-deps --no-build-isolation . \
    && pip check \
    && rm -rf build project.egg-info \
    && mkdir -p /app/data /app/logs \
    && chown trainer:trainer /app/data /app/logs
COPY configs/ configs/
COPY deploy/docker/entrypoint.sh /usr/local/bin/project-entrypoint

# OCI labels: where the image comes from, true to the build: the base it was built FROM (BASE; BASE_DIGEST, the
# digest of that base, when the builder knows it), the commit, version, source and build time (.ci/image passes
# them: --build-arg REVISION=$(git rev-parse HEAD) ...; "unknown" when not given).
ARG REVISION=unknown
ARG VERSION=unknown
ARG CREATED=unknown
ARG SOURCE=unknown
ARG BASE_DIGEST=unknown
LABEL org.opencontainers.image.title="project" \
      org.opencontainers.image.description="SimpleCNN/LeNet Lightning experiments: fit, evaluate, predict, export, sweep" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.base.name="${BASE}" \
      org.opencontainers.image.base.digest="${BASE_DIGEST}"

# PID 1 is tini: the kernel delivers no signal to a namespace's init that has no handler for it, so a Python
# PID 1 without one (the sweep worker) would ignore `docker stop` and a pod's deletion until SIGKILL. tini
# forwards SIGTERM/SIGINT to the command and reaps orphaned processes; TINI_SUBREAPER lets it do the same where
# something else is PID 1 (`docker run --init`, buildah run).
ENV TINI_SUBREAPER=1
USER 1000:1000
VOLUME ["/app/data", "/app/logs"]
ENTRYPOINT ["tini", "--", "project-entrypoint"]
CMD ["--config", "configs/mnist.yaml"]
