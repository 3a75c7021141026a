#!/bin/sh
# The image's entry point. Checks the volumes, then runs the command:
#   IMAGE --config configs/cifar10.yaml ...        python -m project.fit --config configs/cifar10.yaml ...
#   IMAGE evaluate|predict|export|summarize|sweep|fit ARGS...     python -m project.<command> ARGS...
#   IMAGE torchrun ARGS...                         python -m project.cli.torchrun ARGS... (torchrun, with a
#                                                  failed meeting of the nodes as one error line)
#   IMAGE anything else (python, bash)             run as given
# Volumes: every folder in PROJECT_VOLUMES (default: /app/data /app/logs) must be writable by the user the
# container runs as (uid 1000 unless --user or the pod's runAsUser says otherwise); a missing one is created. A
# folder that belongs to another user (Docker creates a missing host folder owned by root; NFS-like volumes keep
# their owner whatever the pod's fsGroup) gives one `error:` line with a fix for where it runs (Docker, or
# Kubernetes: KUBERNETES_SERVICE_HOST is set in every pod) and exit status 1, before anything starts, instead
# of a permission traceback in the middle of a run.
set -eu
volume_error() {  # volume_error DIR WHY: one line, the fix for the folder's owner (DIR or the nearest parent)
  owner=$1
  while [ ! -e "$owner" ]; do owner=$(dirname "$owner"); done
  ouid=$(stat -c %u "$owner") ogid=$(stat -c %g "$owner")
  if [ -n "${KUBERNETES_SERVICE_HOST:-}" ]; then
    if [ "$ouid" != 0 ]; then
      fix="run the pod as the volume's owner: securityContext runAsUser: $ouid, runAsGroup: $ogid (a patch like deploy/kubernetes/overlays/nfs-2x4/volume-owner.yaml; NFS-like volumes ignore fsGroup)"
    else
      fix="the volume belongs to root: have it owned by the pod's user on the file server (chown $(id -u):$(id -g) <export>), or, if it is group-writable, add its group $ogid to the pod's securityContext.supplementalGroups (NFS-like volumes ignore fsGroup)"
    fi
  else
    fix="run the container as the folder's owner (docker run --user \"\$(id -u):\$(id -g)\" ..., podman: --userns keep-id), or on the host: mkdir -p <folder> && chown $(id -u):$(id -g) <folder>"
  fi
  echo "error: $1 (a volume) $2 by uid $(id -u) ($owner belongs to uid $ouid, gid $ogid); $fix" >&2
  exit 1
}
for dir in ${PROJECT_VOLUMES:-/app/data /app/logs}; do
  if [ ! -d "$dir" ]; then
    mkdir -p "$dir" 2>/dev/null || volume_error "$dir" "does not exist and cannot be created"
  elif [ ! -w "$dir" ] || [ ! -x "$dir" ]; then
    volume_error "$dir" "is not writable"
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
  torchrun)  # torchrun itself, with a failed meeting of the nodes as one error line (project/cli/torchrun.py)
    shift
    exec python -m project.cli.torchrun "$@"
    ;;
  "") exec python -m project.fit ;;
  *) exec "$@" ;;
esac
