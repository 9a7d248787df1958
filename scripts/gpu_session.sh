#!/usr/bin/env bash
# One headless session on a machine with an NVIDIA GPU, run from the repository root:
#   1. scripts/gpu_check.py (the acceptance checks, JSON),
#   2. `trainroom demo --device cuda` under a keeper without the control room: ~20 s of training,
#      `status --json`, then `kill` and what it said (exit code, basis, seconds),
#   3. the same demo with `--fault ghost-memory`: GHOST_MEMORY naming the CUDA child, its
#      targeted kill, then the run's kill,
#   4. `demo --device cuda --fault spike --eval`: promotion gated by the demo's evaluation,
#      `trainroom eval` on the latest, `trainroom replay` of the spike's step and of a step before,
#   5. scripts/bench_eval.py on the CPU (the trainer's steps/s with and without an evaluation).
# Everything lands under $OUT (at most 8 files): gpu_check.json, demo_status.json, demo_kill.json,
# ghost_status.json, ghost_kill.json, replay.json, bench_eval.txt, session.log; a summary goes to
# stdout. Bounded to ~8 min.
#
# A machine that cannot reach a package index installs the dependencies its image lacks from
# .wheels/ (ignored by git), prepared beforehand on a machine that can:
#   pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .wheels \
#     msgspec textual sh xxhash prometheus_client nvidia-ml-py psutil
set -u
OUT=${OUT:-/tmp/trainroom-gpu-session}
mkdir -p "$OUT"
LOG="$OUT/session.log"
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu SKIP_INSTALL=1: a rehearsal of the flow on a machine without a GPU
TR=("$PY" -m trainroom.cli)
say() { echo "== $*" | tee -a "$LOG"; }
t0=$(date +%s)

say "install"
if [ -z "${SKIP_INSTALL:-}" ]; then
  if [ -d .wheels ]; then
    "$PY" -m pip install -q --no-index --find-links .wheels --no-build-isolation -e . >>"$LOG" 2>&1
  else
    "$PY" -m pip install -q -e . >>"$LOG" 2>&1
  fi
  if ! "$PY" -c "import trainroom.cli, msgspec, textual" >>"$LOG" 2>&1; then
    echo "editable install failed: the dependencies from .wheels, trainroom from src/" | tee -a "$LOG"
    [ -d .wheels ] && "$PY" -m pip install -q --no-index --find-links .wheels msgspec textual sh xxhash prometheus_client >>"$LOG" 2>&1
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
nvidia-smi >>"$LOG" 2>&1
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$LOG"

if [ -z "${ONLY_DEMOS:-}" ]; then  # ONLY_DEMOS=1: the demos alone (a second, shorter try)
say "gpu_check.py"
timeout 180 "$PY" scripts/gpu_check.py --json --budget-s 160 >"$OUT/gpu_check.json" 2>>"$LOG"
echo "gpu_check exit $?" | tee -a "$LOG"
"$PY" - "$OUT/gpu_check.json" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{r['device']} driver {r['driver']} torch {r['torch']} {r['seconds']} s")
for o in r["outcomes"]:
    figs = {k: v for k, v in o["figures"].items() if v is not None}
    print(f"{o['result'].upper():4} {o['name']:<15} {o['detail'][:300]}  {figs}")
EOF
fi

export TRAINROOM_HOME
TRAINROOM_HOME=$(mktemp -d /tmp/trgs.XXXX)

wait_status() {  # RUN PYTHON-CONDITION-ON-d SECONDS -> prints the status JSON when it holds
  "$PY" - "$@" <<'EOF'
import json, subprocess, sys, time
run, cond, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])
end, d = time.monotonic() + limit, {}
while time.monotonic() < end:
    p = subprocess.run([sys.executable, "-m", "trainroom.cli", "status", run, "--json"], capture_output=True, text=True)
    try:
        d = json.loads(p.stdout)
    except ValueError:
        d = {}
    if d and eval(cond, {"d": d}):
        break
    time.sleep(1.0)
print(json.dumps(d, indent=1))
EOF
}

timed_kill() {  # RUN [ARGS...] -> the kill's JSON, then its exit code and seconds on stderr
  local s e rc
  s=$(date +%s%N)
  timeout 120 "${TR[@]}" kill "$@" --yes --json
  rc=$?
  e=$(date +%s%N)
  echo "kill $* exit $rc in $(( (e - s) / 1000000 )) ms" >&2
}

say "demo --device $DEVICE"
RUN=$(timeout 120 "${TR[@]}" demo --device "$DEVICE" --detach --step-delay 0.02 --ckpt-every 200 2>>"$LOG")
echo "run ${RUN:-none}" | tee -a "$LOG"
if [ -n "${RUN:-}" ]; then
  sleep 20
  wait_status "$RUN" "(d.get('step') or 0) >= 20" 40 >"$OUT/demo_status.json"
  "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print('state', d.get('state'), 'step', d.get('step'), 'steps/s', d.get('steps_per_s')); print('vram', d.get('vram')); print('findings', [f['code'] for f in d.get('findings', [])])" "$OUT/demo_status.json" 2>&1 | tee -a "$LOG"
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv >>"$LOG" 2>&1
  timed_kill "$RUN" >"$OUT/demo_kill.json" 2> >(tee -a "$LOG" >&2)
  sleep 1
  "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print('kill:', d.get('ok'), d.get('message')); print('after:', d.get('after'))" "$OUT/demo_kill.json" 2>&1 | tee -a "$LOG"
  "${TR[@]}" status "$RUN" --json 2>&1 | "$PY" -c "import json,sys; d=json.load(sys.stdin); print('after the kill: state', d['state'], 'vram', d['vram'])" 2>&1 | tee -a "$LOG"
fi

if [ -z "${ONLY_DEMOS:-}" ]; then
say "demo --device $DEVICE --fault ghost-memory"
GRUN=$(timeout 120 "${TR[@]}" demo --device "$DEVICE" --fault ghost-memory --fault-step 30 --detach --step-delay 0.02 --ckpt-every 200 2>>"$LOG")
echo "run ${GRUN:-none}" | tee -a "$LOG"
if [ -n "${GRUN:-}" ]; then
  wait_status "$GRUN" "any(f['code'] == 'GHOST_MEMORY' for f in d.get('findings', []))" 60 >"$OUT/ghost_status.json"
  IDENT=$("$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); f=[f for f in d.get('findings', []) if f['code']=='GHOST_MEMORY']; print(f[0]['ident'] if f else ''); print('GHOST_MEMORY:', f[0]['message'] if f else 'not raised', file=sys.stderr); print('target:', f[0].get('target') if f else None, file=sys.stderr)" "$OUT/ghost_status.json" 2> >(tee -a "$LOG" >&2))
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv >>"$LOG" 2>&1
  if [ -n "$IDENT" ]; then
    timed_kill "$GRUN" --finding "$IDENT" --grace 5 >"$OUT/ghost_kill.json" 2> >(tee -a "$LOG" >&2)
    sleep 1
    "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print('targeted kill:', d.get('ok'), d.get('message'))" "$OUT/ghost_kill.json" 2>&1 | tee -a "$LOG"
  fi
  timed_kill "$GRUN" >>"$LOG" 2> >(tee -a "$LOG" >&2)
fi
fi

say "demo --device $DEVICE --fault spike --eval: gated promotion, eval, replay"
SRUN=$(timeout 120 "${TR[@]}" demo --device "$DEVICE" --fault spike --fault-step 30 --steps 60 --ckpt-every 10 --eval --detach --step-delay 0 --linger 300 2>>"$LOG")
echo "run ${SRUN:-none}" | tee -a "$LOG"
if [ -n "${SRUN:-}" ]; then
  wait_status "$SRUN" "d.get('state') == 'exited' and sum(c['state'] in ('verified', 'held') for c in d.get('checkpoints', [])) >= 6" 150 >"$TRAINROOM_HOME/spike_status.json"
  "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print('state', d.get('state')); [print('ckpt', c['step'], c['state'], (c.get('eval') or {}).get('figure'), (c.get('eval') or {}).get('seconds')) for c in d.get('checkpoints', [])]; print('findings', [f['code'] for f in d.get('findings', [])])" "$TRAINROOM_HOME/spike_status.json" 2>&1 | tee -a "$LOG"
  {
    echo '{"eval":'; timeout 120 "${TR[@]}" eval "$SRUN" --json; echo ', "eval_rc": '$?','
    echo '"replay_31":'; timeout 150 "${TR[@]}" replay "$SRUN" --step 31 --json; echo ', "replay_31_rc": '$?','
    echo '"replay_25":'; timeout 150 "${TR[@]}" replay "$SRUN" --step 25 --json; echo ', "replay_25_rc": '$?'}'
  } >"$OUT/replay.json" 2>>"$LOG"
  cat "$OUT/replay.json" | tee -a "$LOG"
fi

say "bench_eval.py (CPU trainer, with and without an evaluation)"
timeout "${BENCH_S:-240}" "$PY" scripts/bench_eval.py --steps 600 --ckpt-every 50 --pairs "${BENCH_PAIRS:-2}" >"$OUT/bench_eval.txt" 2>>"$LOG"
cat "$OUT/bench_eval.txt" | tee -a "$LOG"

say "clean-up"
for r in ${RUN:-} ${GRUN:-} ${SRUN:-}; do timeout 60 "${TR[@]}" kill "$r" --yes >/dev/null 2>&1; done
sleep 2
nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>&1 | tee -a "$LOG"
rm -rf "$TRAINROOM_HOME"
say "done in $(( $(date +%s) - t0 )) s"
