#!/usr/bin/env bash
# Runs data_parallel_mpi under mpirun with 2 ranks (as root too, more ranks than cores
# allowed). same-steps: every rank's checks pass. hang or exit: rank 0 reports rank 1's
# silence as kiln.dist.collective in step 3, whatever mpirun then does to the job. By default
# mpirun kills every rank as soon as one exits, before a survivor could notice; recovery mode
# leaves the survivors running, as a launcher that does not own every rank (a scheduler
# across machines) would.
#   check_data_parallel_mpi.sh MPIRUN PROGRAM same-steps|hang|exit
set -uo pipefail
mpirun="$1" program="$2" mode="$3"
recovery=()
[[ "$mode" == exit ]] && recovery=(--enable-recovery --mca orte_abort_on_non_zero_status 0)
output="$(timeout 300 "$mpirun" --allow-run-as-root --oversubscribe -np 2 \
  --mca btl self,tcp "${recovery[@]}" "$program" "$mode" 2>&1)"
status=$?
echo "$output"
if [[ "$mode" == same-steps ]]; then
  [[ $status -eq 0 ]] && ! grep -q '^FAIL' <<<"$output" &&
    [[ $(grep -c '^ok:' <<<"$output") -eq 8 ]] && exit 0
  echo "FAIL: mpirun exited $status, or a check failed"
  exit 1
fi
if grep -q '^ok: rank 0: step 3: \[kiln.dist.collective\]' <<<"$output"; then exit 0; fi
echo "FAIL: rank 0 did not report rank 1's silence as kiln.dist.collective in step 3"
exit 1
