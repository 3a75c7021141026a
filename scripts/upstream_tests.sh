#!/usr/bin/env bash
# Runs Lightning's own tests for the parents of the project's Lightning subclasses, once against the parent
# class and once against ours (see scripts/upstream_subject.py and docs/reliability.md).
#
# usage: scripts/upstream_tests.sh LIGHTNING_CHECKOUT [parent|ours|both] [TEST_FILE...]
#   LIGHTNING_CHECKOUT: a Lightning source tree (or an extract of it) with tests/tests_pytorch/ and, for
#   Lightning's pytest settings, pyproject.toml; best at the tag of the installed lightning version, e.g.
#   git clone --depth 1 --branch 2.6.5 https://github.com/Lightning-AI/pytorch-lightning
# TEST_FILE: paths under LIGHTNING_CHECKOUT/tests (default: the four files below); more pytest options through
# PYTEST_ADDOPTS (e.g. "-k name"). Each file runs on its own; prints the failed tests and the summary line per
# file and subject; exit status 1 when any test fails with ours. Needs the project's environment plus
# cloudpickle (imported by test_model_checkpoint.py); the tests run in LIGHTNING_CHECKOUT/tests.
set -u
checkout=$(cd "${1:?usage: $0 LIGHTNING_CHECKOUT [parent|ours|both] [TEST_FILE...]}" && pwd)
which=${2:-both}
shift $(( $# >= 2 ? 2 : 1 ))
repo=$(cd "$(dirname "$0")/.." && pwd)
files=(
  tests_pytorch/checkpointing/test_model_checkpoint.py
  tests_pytorch/callbacks/test_throughput_monitor.py
  tests_pytorch/callbacks/test_lr_monitor.py
  tests_pytorch/loggers/test_tensorboard.py
)
[ $# -gt 0 ] && files=("$@")
case $which in both) subjects=(parent ours) ;; parent|ours) subjects=("$which") ;; *) echo "error: $which: use parent, ours or both" >&2; exit 2 ;; esac
status=0
cd "$checkout/tests" || exit 2
for file in "${files[@]}"; do
  for subject in "${subjects[@]}"; do
    out=$(UPSTREAM_SUBJECT=$subject PYTHONPATH="$repo:$repo/scripts:$checkout/tests${PYTHONPATH:+:$PYTHONPATH}" \
      python -m pytest -q -p no:cacheprovider -p upstream_subject -o addopts="" -rf "$file" 2>&1)
    rc=$?
    [ "$rc" -ne 0 ] && [ "$subject" = ours ] && status=1
    echo "== $file [$subject]"
    echo "$out" | grep -E '^(FAILED|ERROR) |^upstream_subject:|^[0-9]+ (passed|failed|error|skipped)|no tests ran'
  done
done
exit $status
