#!/bin/bash
# Back-to-back jobs on the same nodes: how long a node stays idle between one job's end and the next
# one's start (issue #17, P3's per-job overhead). Run as a researcher on the login pod:
#
#   bash back_to_back.sh PARTITION NODES [JOBS] [SECONDS]
#
# boots NODES nodes of the partition with one job, then queues JOBS exclusive jobs on those NODES
# nodes (`sleep SECONDS`), all at once, so that each starts on the nodes the previous one left.
# Each job writes its own start and end times (date, in the job) under ~/back-to-back/; the gaps
# are end -> next start, in job order. The floor is 0 s: a job starting the moment the last ends.
set -euo pipefail
part=${1:?partition}; nodes=${2:?nodes}; jobs=${3:-10}; secs=${4:-1}
tag=b2b-$$-$RANDOM
dir=$HOME/back-to-back
mkdir -p "$dir"
# the nodes the boot job got: every job is pinned to them (-w), so none runs beside another
on=$(srun -p "$part" -N "$nodes" --exclusive -J "$tag-boot" printenv SLURM_JOB_NODELIST | sort -u)
for _ in $(seq "$jobs"); do
  sbatch --parsable -p "$part" -N "$nodes" -w "$on" --exclusive -J "$tag" -o /dev/null \
    --wrap "date +%s.%N > $dir/$tag.\$SLURM_JOB_ID.start; sleep $secs; date +%s.%N > $dir/$tag.\$SLURM_JOB_ID.end" >/dev/null
done
while squeue -h -n "$tag" | grep -q .; do sleep 0.5; done
python3 - "$dir" "$tag" "$jobs" "$secs" <<'EOF'
import pathlib, statistics, sys
d, tag, jobs, secs = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
ids = sorted({int(p.name.split(".")[1]) for p in d.glob(f"{tag}.*")})
runs = [(float((d / f"{tag}.{i}.start").read_text()), float((d / f"{tag}.{i}.end").read_text())) for i in ids]
for p in d.glob(f"{tag}.*"):
    p.unlink()
gaps = [nxt[0] - cur[1] for cur, nxt in zip(runs, runs[1:])]
if len(runs) != jobs or not gaps:
    sys.exit(f"{len(runs)} of {jobs} jobs left their times: nothing to measure")
print(f"{jobs} jobs back to back: idle between one job's end and the next one's start median "
      f"{statistics.median(gaps):.3f} s, min {min(gaps):.3f} s, max {max(gaps):.3f} s (floor 0 s); "
      f"makespan {runs[-1][1] - runs[0][0]:.2f} s for {jobs * secs:.0f} s of jobs")
EOF
