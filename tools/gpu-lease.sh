#!/usr/bin/env bash
# One short GPU loan (the device tool: 15 minutes in all, 10 per command), run from the checkout
# with wheelhouse/ carried (`make wheelhouse WHEEL_PYTHON=3.12` where there is network):
#   1. make test-gpu (the CUDA-graph tests among them), in the background, while
#   2. the unet's CUDA wheel builds with its spec's options pinned (no candidate search: each
#      unet CUDA compile takes 94-143 s; freezing on, the CUDA target's default, which the spec's
#      own `freezing = false` would otherwise turn off), then installs into a fresh venv that sees
#      the machine's torch, verifies, and loads from the build's folder, without any /opt link, and
#      through the link its runtime makes; its CUDA graphs are checked bitwise against torch's
#      runner at batch 1 and 8;
#   3. make bench TARGET=cuda on that wheel (--wheel --lease): eager, torch.compile, reduce-overhead,
#      the wheel without and with CUDA graphs, batch 1 and 8 (torch.compile's default mode at batch 1
#      only), and the three targets; the bench comes before the install checks of step 2, which
#      need about 40 s: on an H200 (2026-11-28) setup took 21 s, the build 219 s, and the bench's
#      latencies about 250 s; its fresh starts fill what is left.
# Its logs go to $OUT (default build/gpu-lease); the last lines it prints are a summary. The device
# tool brings back at most 8 files from $OUT: the small records stay in $LOGS, and logs.tgz has all.
set -u
OUT=${OUT:-build/gpu-lease}
LOGS=${LOGS:-build/gpu-lease-records}
PY=${PYTHON:-/opt/torch/.venv/bin/python3}
DEADLINE=$(( $(date +%s) + ${LEASE_S:-570} ))
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$LOGS"
left() { echo $(( DEADLINE - $(date +%s) )); }
say() { echo "[$(date +%T), $(left) s left] $*"; }
summary=()
note() { summary+=("$*"); say "$*"; }

{ nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv; nproc; g++ --version | head -1
  "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.get_device_capability())'
} > "$LOGS/machine.txt" 2>&1
cat "$LOGS/machine.txt"

say "installing the pipeline's needs offline (make current-env)"
make --no-print-directory current-env USE_VENV=0 PYTHON="$PY" > "$OUT/setup.log" 2>&1 || { tail -40 "$OUT/setup.log"; exit 1; }

say "make test-gpu, in the background"
( timeout $(( $(left) - ${BENCH_S:-200} )) make --no-print-directory test-gpu PYTHON="$PY" ARGS="-rs -p no:cacheprovider --durations=10" \
    > "$OUT/test-gpu.log" 2>&1; echo "rc=$?" >> "$OUT/test-gpu.log" ) &
tests=$!

spec=models/unet/.bench-gpu.toml  # ignored (.gitignore); the spec's options, pinned
sed -e 's/^\[compile\]$/[compile]\nsearch = false/' -e "s/^freezing = false$/freezing = ${FREEZING:-true}/" models/unet/spec.toml > "$spec"
# make build's own line (its current-env step would pip-install beside test-gpu's at once)
say "make build MODEL=unet TARGET=cuda (search = false, freezing = ${FREEZING:-true})"
started=$(date +%s)
timeout $(( $(left) - 150 )) "$PY" -m pipeline build --spec "$spec" --target cuda --overwrite > "$OUT/unet-build.log" 2>&1
note "unet cuda build: rc=$? in $(( $(date +%s) - started )) s"
grep -E "stages|verified|wheel  |error|hint" "$OUT/unet-build.log"
wheel=$(ls -t dist/model_unet-*cu*.whl 2>/dev/null | head -1)

say "waiting for make test-gpu"
wait $tests
note "make test-gpu: $(grep -E 'passed|failed|error' "$OUT/test-gpu.log" | tail -1) $(tail -1 "$OUT/test-gpu.log")"

if [ -n "$wheel" ] && [ "$(left)" -gt 60 ]; then
  say "make bench MODEL=unet TARGET=cuda on that wheel (--lease)"
  # the unet checks below need about 40 s: the bench leaves them that (its table is on disk row by row)
  timeout $(( $(left) - ${CHECKS_S:-45} )) make --no-print-directory bench SPEC="$spec" TARGET=cuda USE_VENV=0 PYTHON="$PY" \
    ARGS="--wheel $wheel --lease" 2>&1 | while IFS= read -r line; do echo "[$(date +%T)] $line"; done > "$OUT/bench.log"
  note "bench: rc=${PIPESTATUS[0]}"
  cp build/bench/unet-cuda/results.md "$OUT/" 2>/dev/null
  cp build/bench/unet-cuda/results.json "$LOGS/" 2>/dev/null
fi

if [ -n "$wheel" ] && [ "${CHECKS:-1}" = 1 ] && [ "$(left)" -gt 20 ]; then
  env_python=$("$PY" -c 'import sys; sys.path.insert(0, "."); from pathlib import Path; from benchmarks import torch_venv; print(torch_venv.create(Path("/tmp/unet-env")))')
  "$env_python" -m pip install --quiet --no-index --no-deps "$wheel" > "$OUT/unet-checks.log" 2>&1
  note "unet wheel installed: rc=$? ($(basename "$wheel")); pip check: $("$env_python" -m pip check 2>&1 | tail -1)"
  opt=$(cd / && "$env_python" -c 'import model_unet as m; print(m.manifest()["opt_path"])')
  root=${opt%/unet/*}
  check() {  # $1: what; runs verify and a load from /, prints where the library came from
    local out
    out=$(cd / && /tmp/unet-env/bin/model-unet verify 2>&1; echo "verify rc=$?"
          "$env_python" -W default -c 'import model_unet as m; x = m.load(); y = x(*m.example_inputs(device="cuda")); print("library", x.library, "out", y[0].device, tuple(y[0].shape))' 2>&1)
    echo "== $1" >> "$OUT/unet-checks.log"; echo "$out" >> "$OUT/unet-checks.log"
    note "$1: $(echo "$out" | grep -E 'verify rc=|^library|Error|error|Warning' | tr '\n' ' ' | cut -c1-600)"
  }
  ls -ld "$root" "$opt" >> "$OUT/unet-checks.log" 2>&1
  check "through the /opt link the runtime makes"
  note "link: $(ls -ld "$opt" 2>&1)"
  [ -e "$root" ] && mv "$root" "$root.aside"; echo "no link can be made here" > "$root"
  check "without the /opt link ($root is a file)"
  rm -f "$root"
  (cd / && "$env_python" -c 'import json, model_unet as m; d = m.manifest(); print(json.dumps({k: d[k] for k in ("target", "cuda", "platform", "torch") if k in d}))') \
    > "$LOGS/unet-manifest.json" 2>&1
  # the unet through CUDA graphs (load()'s default) against torch's runner, bitwise, at batch 1 and 8
  graphs=$(cd / && "$env_python" -W default -c '
import torch, model_unet as m
g, r = m.load(), m.load(cuda_graphs=False)
both = lambda o: o if isinstance(o, tuple) else (o,)
for b in (1, 8):
    x = m.example_inputs(seed=b, device="cuda", batch=b)
    print(f"batch {b}: bitwise equal {all(torch.equal(p, q) for p, q in zip(both(g(*x)), both(r(*x))))};", end=" ")
info = g.info(); print("path:", info["path"], "graphs:", len(info.get("graphs", [])), info.get("refused", ""))' 2>&1 | tail -3)
  echo "$graphs" >> "$OUT/unet-checks.log"
  note "unet CUDA graphs: $(echo "$graphs" | tr '\n' ' ' | cut -c1-400)"
  note "manifest: $(sed 's/"kernels": \[[^]]*\]/"kernels": [...]/' "$LOGS/unet-manifest.json" | cut -c1-700)"
fi

cp "$OUT"/*.log "$OUT"/*.md "$LOGS/" 2>/dev/null
tar -czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null
echo; echo "==== summary"; printf '%s\n' "${summary[@]}"
grep -E '^(FAILED|ERROR|SKIPPED)' "$OUT/test-gpu.log" | head -20
grep -E '==>|median' "$OUT/bench.log" 2>/dev/null | tail -30
cat "$OUT/results.md" 2>/dev/null
