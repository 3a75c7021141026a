#!/usr/bin/env bash
# The GPU checks, as one prepared script: run it on a CUDA machine from the repository root, with the project
# installed (README: Two commands) and the Fashion-MNIST archives in a folder:
#
#   scripts/gpu_checks.sh OUT_DIR FASHION_ARCHIVES_DIR
#
# 1. bench, SimpleCNN / CIFAR-10-shaped synthetic data (no CIFAR-10 needed): raw loop, Lightning, in-memory,
#    16-mixed, cudnn.benchmark, channels_last; samples/s, fraction of the GPU's measured GEMM ceiling; the
#    CIFAR-10 epoch time follows as 45,000 / samples/s;
# 2. LeNet on real Fashion-MNIST, the tuned config, 2 epochs, 32-true vs 16-mixed: test accuracy and epoch time;
# 3. OUT_DIR/gpu.md: both tables, the GPU's name, torch/CUDA versions.
# QUICK=1 shortens everything (a smoke run; DEVICE=cpu runs it without a GPU).
set -euo pipefail
out=${1:?usage: scripts/gpu_checks.sh OUT_DIR FASHION_ARCHIVES_DIR}
archives=${2:?usage: scripts/gpu_checks.sh OUT_DIR FASHION_ARCHIVES_DIR}
device=${DEVICE:-cuda}
mkdir -p "$out"
if [ "${QUICK:-0}" = 1 ]; then
  bench_args=(--steps 3 --warmup 1 --repeats 1); fit_args=(--trainer.limit_train_batches 5 --trainer.max_epochs 1)
else
  bench_args=(--steps 100 --warmup 20 --repeats 5); fit_args=(--trainer.max_epochs 2)
fi
accelerator=$([ "$device" = cuda ] && echo gpu || echo cpu)

python - <<'EOF' | tee "$out/env.txt"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
EOF

python -m benchmarks.bench --config configs/cifar10.yaml --device "$device" --data_dir "$out/no-cifar" \
  --rows raw_loop lightning lightning_in_memory mixed_precision benchmark channels_last \
  "${bench_args[@]}" --out "$out/bench_cifar10.json"

for precision in 32-true 16-mixed; do
  python -m project.fit --config configs/fashion_mnist.yaml --data.source_dir "$archives" \
    --data.data_dir "$out/data" --trainer.accelerator "$accelerator" --trainer.precision "$precision" \
    --trainer.enable_progress_bar false --trainer.logger.init_args.save_dir "$out/logs" \
    --trainer.logger.init_args.name "fashion_$precision" "${fit_args[@]}"
done

python - "$out" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
lines = [Path(out / "env.txt").read_text().strip().replace("\n", "; "), "", (out / "bench_cifar10.md").read_text()]
rows = json.loads((out / "bench_cifar10.json").read_text())["rows"]
for r in rows:
    lines.append(f"- {r['row']}: CIFAR-10 epoch (45,000 images) {45000 / r['samples_per_s']:.2f} s")
lines += ["", "| LeNet / Fashion-MNIST, tuned config | precision | test acc | epoch time (s) | train samples/s |",
          "|---|---|---:|---:|---:|"]
for run in sorted(out.glob("logs/fashion_*/version_*")):
    r = json.loads((run / "results.json").read_text())
    epoch_s = ", ".join(f"{t:.2f}" for t in r["epoch_time_s"])  # one per epoch
    lines.append(f"| {run.parent.name} | {r['precision']} | {r['test_acc']:.4f} | {epoch_s} "
                 f"| {r['train_samples_per_s']:,.0f} |")
(out / "gpu.md").write_text("\n".join(lines) + "\n")
print((out / "gpu.md").read_text())
EOF
