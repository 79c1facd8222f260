#!/usr/bin/env bash
# The README's srun line, exactly as written, against a one-node SLURM this
# test starts from Debian's packages (munge, slurmctld, slurmd) in a scratch
# folder, running the README's my_job.c: every rank must print the sum over
# the ranks. Skips (77) with the reason where SLURM cannot run: not root,
# the packages not installed, or a SLURM already running here.
#   slurm.sh SOURCE_ROOT BUILD_ROOT
set -uo pipefail
src=$(cd "$1" && pwd); build=$(cd "$2" && pwd)
[ "$(id -u)" = 0 ] || { echo "skipped: starting slurmctld and slurmd needs root"; exit 77; }
for c in slurmctld slurmd srun sinfo munged munge; do
  command -v $c >/dev/null || {
    echo "skipped: $c is not installed (apt-get install slurmctld slurmd slurm-client munge)"; exit 77; }
done
pgrep -x -r S,R,D slurmctld >/dev/null && { echo "skipped: a SLURM controller already runs here"; exit 77; }
t=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$t"
}
trap cleanup EXIT
if ! munge -n >/dev/null 2>&1; then  # no munged yet: start one for the test
  mkdir -p /run/munge && chown munge:munge /run/munge
  runuser -u munge -- /usr/sbin/munged --foreground >"$t/munged.out" 2>&1 & pids+=($!)
  for _ in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n >/dev/null 2>&1 || { echo "skipped: munged does not start here"; exit 77; }
fi
host=$(hostname -s)
mkdir -p "$t/state" "$t/spool"
cat > "$t/slurm.conf" <<CONF
ClusterName=collie
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$t/state
SlurmdSpoolDir=$t/spool
SlurmctldPidFile=$t/slurmctld.pid
SlurmdPidFile=$t/slurmd.pid
SlurmctldLogFile=$t/slurmctld.log
SlurmdLogFile=$t/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$t/slurm.conf"
slurmctld -D -i -f "$SLURM_CONF" >"$t/slurmctld.out" 2>&1 & pids+=($!)
slurmd -D -f "$SLURM_CONF" >"$t/slurmd.out" 2>&1 & pids+=($!)
for _ in $(seq 100); do grep -q idle <<<"$(sinfo -h -o %T 2>/dev/null)" && break; sleep 0.2; done
grep -q idle <<<"$(sinfo -h -o %T 2>/dev/null)" || {
  echo "skipped: the one-node SLURM did not come up here"; tail -5 "$t/slurmctld.log" "$t/slurmd.log"; exit 77; }

awk '/^```c my_job.c$/ {on=1; next} on && /^```$/ {exit} on {print}' "$src/README.md" > "$t/my_job.c"
cc -std=c11 -I"$src/include" "$t/my_job.c" -L"$build" -l:libcollie.so.0 -Wl,-rpath,"$build" -o "$t/my_job" ||
  { echo "FAILED: building the README's my_job.c"; exit 1; }
line=$(grep -o 'srun -n [0-9]* ./my_job' "$src/README.md" | head -1)
[ -n "$line" ] || { echo "FAILED: the README's srun line is gone"; exit 1; }
n=$(awk '{print $3}' <<<"$line")
out=$(cd "$t" && env -u LD_LIBRARY_PATH COLLIE_TIMEOUT=60 timeout 300 $line 2>&1); rc=$?
fail=0
[ $rc = 0 ] || fail=1
for r in $(seq 0 $((n - 1))); do
  grep -q "^rank $r of $n: sum of ranks $((n * (n - 1) / 2))$" <<<"$out" || fail=1
done
if [ $fail = 1 ]; then echo "$line exited $rc:"; echo "$out"; echo FAILED; exit 1; fi
# The example engine with the same line: it trains and checks that every
# rank's replica is identical.
out=$(cd "$t" && env -u LD_LIBRARY_PATH COLLIE_TIMEOUT=60 timeout 300 ${line/.\/my_job/$build/examples/train_mlp --steps 20} 2>&1); rc=$?
if [ $rc != 0 ] || ! grep -q "replicas identical on all $n ranks: yes" <<<"$out"; then
  echo "train_mlp under srun exited $rc:"; echo "$out"; echo FAILED; exit 1
fi
# The mpi backend under srun with PMIx: MPI starts from SLURM's own launch,
# no mpirun and no rendezvous store; the collective suite must pass on it.
mpi_note=""
if grep -q 'COLLIE_HAVE_MPI 1' "$build/collie_build_config.h"; then
  out=$(cd "$t" && COLLIE_BACKEND=mpi COLLIE_EXPECT_BACKEND=mpi COLLIE_TIMEOUT=60 timeout 300 \
    srun --mpi=pmix -n 2 "$build/tests/test_collectives" 2>&1); rc=$?
  if [ $rc != 0 ] || [ "$(grep -c 'PASSED' <<<"$out")" != 2 ]; then
    echo "test_collectives on the mpi backend under srun --mpi=pmix exited $rc:"; echo "$out"; echo FAILED; exit 1
  fi
  mpi_note="; the collective suite passed on the mpi backend under srun --mpi=pmix"
fi
echo "SLURM: '$line' ran every rank with the rendezvous derived from the job id; train_mlp's replicas identical$mpi_note"
