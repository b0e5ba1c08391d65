#!/usr/bin/env bash
# The GPU check of docs/gpu-validation.md, as one command on a lent GPU machine (the device tool):
# loopaudit and its two compiled dependencies are installed from wheels carried in .whl/ (the machine
# reaches no package index), then `loopaudit run` measures gpu_check.py and the examples on CUDA, and
# the dynamic mode's tests run there. Everything it writes lands in $OUT. The wheels, fetched here
# for that machine's Python 3.12 (git-ignored through .git/info/exclude):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp #     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl libcst==1.9.0 ijson==3.6.0
set -u
export PYTHONUNBUFFERED=1
log=$OUT/log.txt
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --target /tmp/site .
} > "$log" 2>&1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
cd benchmarks/gpu
echo "== loopaudit run --profile gpu_check.py (json)" >> "$log"
timeout 180 loopaudit run gpu_check.py --profile --trace-out "$OUT/gpu_check.pt.trace.json.gz" --output-format json \
  > "$OUT/run_gpu_check.json" 2>> "$log"; echo "exit $?" >> "$log"
echo "== loopaudit run gpu_check.py (full)" >> "$log"
timeout 180 loopaudit run gpu_check.py >> "$log" 2>&1; echo "exit $?" >> "$log"
echo "== loopaudit analyze of that trace" >> "$log"
loopaudit analyze "$OUT/gpu_check.pt.trace.json.gz" >> "$log" 2>&1; echo "exit $?" >> "$log"
for example in slow_loop fast_loop; do
  echo "== loopaudit run examples/$example.py (json)" >> "$log"
  timeout 180 loopaudit run "../../examples/$example.py" --output-format json > "$OUT/run_$example.json" 2>> "$log"; echo "exit $?" >> "$log"
done
cd ../..
echo "== tests of the dynamic mode, on CUDA" >> "$log"
timeout 240 python3 -m pytest -q -o addopts="" -n 8 -p no:cacheprovider tests/test_runtime_rule_examples.py tests/test_run_cli.py \
  tests/test_probe.py tests/test_run_signals.py >> "$log" 2>&1; echo "exit $?" >> "$log"
