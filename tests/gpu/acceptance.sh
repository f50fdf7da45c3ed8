#!/usr/bin/env bash
# GPU acceptance run: exercise every GPU path of gpu-preflight on a machine with NVIDIA GPUs and keep the evidence.
#
#   tests/gpu/acceptance.sh OUT_DIR [--dry-run] [--budget SECONDS] [--wheels DIR]
#
# From a fresh clone, in under 8 minutes: a virtualenv that keeps the box's own torch (or gets a CUDA torch), the
# tool's dependencies, then snapshot --bench (kept as tests/fixtures/machines/recorded-<gpu>-<n>x.json), bootstrap,
# the gpu-marked tests, verify (image and text model, staged photos, --sweep, --ab) and, with two or more GPUs,
# the local NCCL all-reduce and the p2p copy matrix (bootstrap judges both too: gpu-allreduce, gpu-p2p). Each
# step has its own timeout and the run a total budget; a step that fails or times out is
# recorded and the next one runs. OUT_DIR gets every report, CSV, PNG and log, plus summary.json and summary.md
# (tests/gpu/summarise.py): each step with its exit code and seconds, and every benchmark figure as a fraction of
# its datasheet value. --dry-run lists the steps (command and timeout) and runs nothing.
#
# Environment: ACCEPTANCE_PYTHON (the box's Python, default python3), ACCEPTANCE_WORK (venv, photos, staged data,
# HOME of the tool; default a new temporary folder), TORCH_INDEX (PyTorch wheel index, default
# https://download.pytorch.org/whl). --wheels DIR installs the dependencies from a wheelhouse, for a box without
# network: `pip download -d DIR $(python tests/gpu/prepare.py requirements) pytest` for the box's Python.
set -uo pipefail
{  # read whole before anything runs: an edit to this file during a run cannot change the run

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
usage() { echo "usage: tests/gpu/acceptance.sh OUT_DIR [--dry-run] [--budget SECONDS] [--wheels DIR]" >&2; exit 2; }

OUT="" DRY_RUN=0 BUDGET=430 WHEELS=""  # 430 + a last step's 15 s kill grace + the summary: under 8 minutes
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --budget) [ $# -ge 2 ] || usage; BUDGET=$2; shift ;;
        --wheels) [ $# -ge 2 ] || usage; WHEELS=$2; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ {print; next} NR > 1 {exit}' "$0"; exit 0 ;;
        -*) usage ;;
        *) [ -z "$OUT" ] || usage; OUT=$1 ;;
    esac
    shift
done
[ -n "$OUT" ] || usage
case "$BUDGET" in '' | *[!0-9]*) usage ;; esac
SUMMARY_RESERVE=30  # seconds kept back from the budget for the summary
MIN_STEP=30         # a step that would get less than this is skipped for the budget (verify keeps 20 s back)

# --- the plan: name | timeout (s) | when | command (run by bash in the checkout, tool env set) ---------------------
# $OUT, $WORK, $VENV, $GPU_COUNT, $GPU_NAME, $PRECISION and $STEP_TIMEOUT are set when the step runs.
# Verify kills its own training child before the step's timeout (verify.timeout_s), so no child outlives a step.
VERIFY='INVOKE_PREFLIGHT_VERIFY_TIMEOUT_S=$((STEP_TIMEOUT - 20)) INVOKE_PREFLIGHT_VERIFY_PRECISION=$PRECISION python -m invoke verify'
if [ -n "$WHEELS" ]; then
    DEPS='python -m pip install --progress-bar off --no-index --find-links "'"$WHEELS"'" $(python tests/gpu/prepare.py requirements) pytest'
else
    DEPS='python -m pip install --progress-bar off --timeout 20 --retries 1 . pytest'
fi
# On a box with 2+ GPUs snapshot --bench and bootstrap also run gpu-p2p and gpu-allreduce (issue 10): a short
# all-reduce budget keeps them inside their step's timeout (1 GiB takes milliseconds on NVLink, the sweep is short).
TOPOLOGY_BUDGET='INVOKE_PREFLIGHT_TOPOLOGY_ALLREDUCE_BUDGET_S=15'
# verify -- COMMAND on the scripts in tests/gpu/scripts (a user's own training, unchanged): the CUDA-event clocks
# of the injected agent, its DDP comm hook on NCCL, and the DataLoader candidates it times (kept to 40 s here).
COMMAND_ADVICE='INVOKE_PREFLIGHT_VERIFY_COMMAND_ADVICE_S=40'
PLAN=(
    "venv|90|always|\"\$ACCEPTANCE_PYTHON\" tests/gpu/prepare.py venv \"\$VENV\""
    "torch|300|always|python tests/gpu/prepare.py torch --index \"\$TORCH_INDEX\""
    "deps|180|always|$DEPS"
    "snapshot|120|always|$TOPOLOGY_BUDGET python -m invoke snapshot --bench --out \"\$OUT/snapshot.json\" --description \"\$GPU_COUNT x \$GPU_NAME, recorded by tests/gpu/acceptance.sh (invoke snapshot --bench)\""
    "fixture|30|always|python tests/gpu/summarise.py fixture \"\$OUT/snapshot.json\" tests/fixtures/machines \"\$OUT/fixtures\""
    "bootstrap|150|always|$TOPOLOGY_BUDGET python -m invoke bootstrap --json \"\$OUT/bootstrap.json\""
    "gpu-tests|150|always|python -m pytest -m gpu -o addopts=-ra tests/gpu -rs -p no:cacheprovider --junitxml=\"\$OUT/gpu-tests.xml\""
    "photos|60|always|python tests/gpu/prepare.py photos \"\$WORK/photos\" --count 512"
    "cmd-photos|150|always|$COMMAND_ADVICE $VERIFY --json \"\$OUT/verify/cmd-photos.json\" -- python tests/gpu/scripts/photo_classifier.py \"\$WORK/photos\""
    "cmd-lm|100|always|$VERIFY --json \"\$OUT/verify/cmd-lm.json\" -- python tests/gpu/scripts/token_lm.py"
    "cmd-ddp|100|always|$VERIFY --json \"\$OUT/verify/cmd-ddp.json\" -- python -m torch.distributed.run --standalone --nproc-per-node=\$GPU_COUNT --max-restarts=0 tests/gpu/scripts/ddp_nccl.py"
    "verify-image|150|always|$VERIFY --json \"\$OUT/verify/image.json\""
    "verify-text|150|always|INVOKE_PREFLIGHT_VERIFY_DATA_KIND=tokens $VERIFY --json \"\$OUT/verify/text.json\""
    "stage-data|120|always|python -m invoke stage-data --source \"\$WORK/photos\" --dest \"\$WORK/staged\" --size 64 && cp \"\$WORK/staged/manifest.json\" \"\$OUT/stage-manifest.json\""
    "verify-data|150|always|$VERIFY --data \"\$WORK/staged\" --batch-size 64 --steps 20 --json \"\$OUT/verify/data.json\""
    "allreduce|120|gpus>=2|cd \"\$WORK\" && python -m torch.distributed.run --standalone --nproc-per-node=\$GPU_COUNT --max-restarts=0 \"$REPO/checks/probe/scripts/allreduce.py\" --backend nccl --max-mib 1024 --budget-s 30 --timeout-s 90 > \"\$OUT/allreduce.json\""
    "p2p|90|gpus>=2|cd \"\$WORK\" && python \"$REPO/checks/probe/scripts/p2p_bench.py\" '{\"mib\": 256, \"warmup\": 2, \"repeats\": 5}' > \"\$OUT/p2p.json\""
    "verify-sweep|180|always|INVOKE_PREFLIGHT_VERIFY_SWEEP_MAX_BATCH=2048 INVOKE_PREFLIGHT_VERIFY_SWEEP_STEPS=4 $VERIFY --sweep --steps 20 --json \"\$OUT/verify/sweep.json\""
    "verify-ab|240|always|$VERIFY --ab --steps 20 --json \"\$OUT/verify/ab.json\""
)
SUMMARY_CMD='python tests/gpu/summarise.py summary "$OUT"'

if [ "$DRY_RUN" = 1 ]; then
    echo "GPU acceptance run (dry run, nothing runs): budget ${BUDGET}s + ${SUMMARY_RESERVE}s for the summary, output in $OUT"
    for entry in "${PLAN[@]}"; do
        IFS='|' read -r name timeout when command <<< "$entry"
        printf '%-13s timeout %3ss  when %-7s  %s\n' "$name" "$timeout" "$when" "$command"
    done
    printf '%-13s timeout %3ss  when %-7s  %s\n' summary "$SUMMARY_RESERVE" always "$SUMMARY_CMD"
    exit 0
fi

# --- the machine -----------------------------------------------------------------------------------------------------
START=$SECONDS
mkdir -p "$OUT/logs" "$OUT/verify" || exit 2
OUT=$(cd "$OUT" && pwd)
WORK=${ACCEPTANCE_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-preflight-acceptance.XXXXXX")}
mkdir -p "$WORK/home" "$WORK/cache" && WORK=$(cd "$WORK" && pwd)
VENV="$WORK/venv"
ACCEPTANCE_PYTHON=${ACCEPTANCE_PYTHON:-$(command -v python3 || command -v python)}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl}
GPU_LIST=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null ||
    nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)  # drivers before 510 have no compute_cap
GPU_COUNT=$(printf '%s' "$GPU_LIST" | grep -c . || true)
GPU_NAME=$(printf '%s\n' "$GPU_LIST" | head -n 1 | cut -d, -f1)
# bf16 autocast where every card has it (compute capability 8.0 and up); else verify's own choice (fp16 on sm_7x).
MIN_MAJOR=$(printf '%s\n' "$GPU_LIST" | awk -F', *' 'NF > 1 {split($2, v, "."); if (m == "" || v[1] + 0 < m) m = v[1] + 0} END {print m}')
PRECISION=auto
[ -n "$MIN_MAJOR" ] && [ "$MIN_MAJOR" -ge 8 ] && PRECISION=bf16
export OUT WORK VENV ACCEPTANCE_PYTHON TORCH_INDEX GPU_COUNT GPU_NAME PRECISION
echo "GPU acceptance run: ${GPU_COUNT} GPU(s) ${GPU_NAME:-none}, verify precision $PRECISION, budget ${BUDGET}s"
echo "output: $OUT   work: $WORK"
[ "$GPU_COUNT" -gt 0 ] || echo "warning: nvidia-smi lists no GPU; the steps run anyway and will say what fails" >&2
printf 'name\ttimeout_s\twhen\tcommand\n' > "$OUT/plan.tsv"
printf 'name\tstatus\trc\tseconds\ttimeout_s\tnote\n' > "$OUT/steps.tsv"
{
    echo "started $(date -u +%FT%TZ) on $(hostname), checkout $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    printf '%s\n' "$GPU_LIST"
} > "$OUT/machine.txt"

# The tool runs with a HOME and cache of its own: bootstrap writes the allocator setting into HOME's shell files
# and keeps disk figures in XDG_CACHE_HOME; neither touches the box's own.
run_step() {  # name, timeout, command
    local name=$1 limit=$2 command=$3 rc began
    began=$SECONDS
    STEP_TIMEOUT=$limit HOME="$WORK/home" XDG_CACHE_HOME="$WORK/cache" NO_COLOR=1 PATH="$VENV/bin:$PATH" \
        timeout --kill-after=15 "$limit" bash -c "cd \"$REPO\" && $command" > "$OUT/logs/$name.log" 2>&1 < /dev/null
    rc=$?
    record "$name" "$rc" $((SECONDS - began)) "$limit"
    [ "$rc" = 0 ] || echo "              last line of logs/$name.log: $(grep -v '^[[:space:]]*$' "$OUT/logs/$name.log" | tail -n 1 | cut -c1-200)"
}

record() {  # name, rc, seconds, timeout [, note]
    local status=ok
    case "$2" in 0) ;; 124 | 137) status=timeout ;; skipped) status=skipped ;; *) status=failed ;; esac
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$status" "$2" "$3" "$4" "${5:-}" >> "$OUT/steps.tsv"
    printf '%-13s %-8s rc=%-4s %4ss  %s\n' "$1" "$status" "$2" "$3" "${5:-}"
}

for entry in "${PLAN[@]}"; do
    IFS='|' read -r name timeout when command <<< "$entry"
    printf '%s\t%s\t%s\t%s\n' "$name" "$timeout" "$when" "$command" >> "$OUT/plan.tsv"
    if [ "$when" = "gpus>=2" ] && [ "$GPU_COUNT" -lt 2 ]; then
        record "$name" skipped 0 "$timeout" "needs two or more GPUs (this box: $GPU_COUNT)"
        continue
    fi
    left=$((BUDGET - (SECONDS - START)))
    if [ "$left" -lt "$MIN_STEP" ]; then
        record "$name" skipped 0 "$timeout" "the ${BUDGET}s budget is spent"
        continue
    fi
    [ "$timeout" -le "$left" ] || timeout=$left
    run_step "$name" "$timeout" "$command"
done

# The summary runs whatever happened above; the venv's Python reads the datasheet table (PyYAML), else the box's.
PY="$VENV/bin/python"
[ -x "$PY" ] || PY=$ACCEPTANCE_PYTHON
printf '%s\t%s\t%s\t%s\n' summary "$SUMMARY_RESERVE" always "$SUMMARY_CMD" >> "$OUT/plan.tsv"
(cd "$REPO" && timeout "$SUMMARY_RESERVE" "$PY" tests/gpu/summarise.py summary "$OUT") || \
    echo "summary failed: the steps are in $OUT/steps.tsv and their logs in $OUT/logs/" >&2
echo "done in $((SECONDS - START))s: $OUT/summary.md"
exit 0
}
