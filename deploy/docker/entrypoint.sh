#!/bin/sh
# The image's entry point. Checks the volumes, then runs the command:
#   IMAGE --config configs/cifar10.yaml ...        python -m project.fit --config configs/cifar10.yaml ...
#   IMAGE evaluate|predict|export|summarize|sweep|fit ARGS...     python -m project.<command> ARGS...
#   IMAGE anything else (python, torchrun, bash)   run as given
# Volumes: every folder in PROJECT_VOLUMES (default: /app/data /app/logs) must be writable by the user the
# container runs as (uid 1000 unless --user says otherwise). A host folder that does not exist yet (Docker then
# creates it owned by root) or that belongs to another user gives one `error:` line with the fix and exit
# status 1, before anything starts, instead of a permission traceback in the middle of a run.
set -eu
for dir in ${PROJECT_VOLUMES:-/app/data /app/logs}; do
  if [ ! -d "$dir" ]; then
    mkdir -p "$dir" 2>/dev/null || { echo "error: $dir does not exist and cannot be created by uid $(id -u)" >&2; exit 1; }
  elif [ ! -w "$dir" ] || [ ! -x "$dir" ]; then
    echo "error: $dir (a volume) is not writable by uid $(id -u) (it belongs to uid $(stat -c %u "$dir"));" \
      "run the container as the folder's owner (docker run --user \"\$(id -u):\$(id -g)\" ...), or on the host:" \
      "mkdir -p <folder> && chown $(id -u):$(id -g) <folder> (Kubernetes: securityContext.fsGroup: $(id -g))" >&2
    exit 1
  fi
done
# Another --user than the image's own has no writable home: caches (matplotlib, torch) go to a temporary one.
if [ ! -w "${HOME:-/}" ]; then
  HOME=$(mktemp -d)
  export HOME
fi
case "${1:-}" in
  -*) exec python -m project.fit "$@" ;;
  fit | evaluate | predict | export | summarize | sweep)
    command=$1
    shift
    exec python -m "project.$command" "$@"
    ;;
  "") exec python -m project.fit ;;
  *) exec "$@" ;;
esac
