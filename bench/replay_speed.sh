#!/usr/bin/env bash
# Wall time of the replay targets (docs/results.md): the paper preset with every policy, and a
# ~10,000-call replay (313 sessions at the paper's 32 calls per session) with every policy.
set -euo pipefail
cd "$(dirname "$0")/.."
talaria=.venv/bin/talaria
mkdir -p out
echo "== paper preset, all policies + dedicated + oracle"
/usr/bin/time -f "wall %e s, max RSS %M KB" $talaria replay --preset paper --no-progress \
    --json out/bench-paper.json > out/bench-paper.txt
echo "== 10,016 calls (313 sessions), all policies + dedicated + oracle"
/usr/bin/time -f "wall %e s, max RSS %M KB" $talaria replay --preset paper --sessions 313 \
    --no-progress --json out/bench-10k.json > out/bench-10k.txt
python3 - <<'PY'
import json
doc = json.load(open("out/bench-10k.json"))
print("10k replay: calls per policy", {k: v["calls_completed"] for k, v in doc["policies"].items()})
PY
