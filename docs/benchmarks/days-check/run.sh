#!/bin/bash
# Every days-check report in this folder, one run after another (about 20 minutes on 2 shared
# cores): `bash docs/benchmarks/days-check/run.sh` from the repository root.
set -u
out=docs/benchmarks/days-check
one() {  # model-or-config seed stem [extra flags...]
  local model=$1 seed=$2 stem=$3; shift 3
  nice -n 10 .venv/bin/python -m training days-check "$model" --seed "$seed" --quiet \
    --out "$out/$stem-seed$seed.json" --table "$out/$stem-seed$seed.md" "$@" \
    > "${LOG_DIR:-/tmp}/$stem-seed$seed.log" 2>&1
  local code=$?
  echo "$(date -u +%T) $stem seed$seed exit $code"
}
for seed in 0 1 2; do one pm2_5-antwerp-1h $seed pm2_5-antwerp-1h; done
for seed in 0 1 2; do
  one pm2_5-antwerp-1h $seed pm2_5-antwerp-1h-d14-m72 --period-days 14 --margin-hours 72
done
for seed in 0 1; do
  one pm10-ispra-1min-rh-temp $seed pm10-ispra-1min-rh-temp
  one pm10-ispra-1min $seed pm10-ispra-1min
  one $out/configs/pm10-ispra-1min-linear-head.json $seed pm10-ispra-1min-linear-head
  one pm10-ispra-1min-rh-temp $seed pm10-ispra-1min-rh-temp-d2 --period-days 2
  one pm10-ispra-1min $seed pm10-ispra-1min-d2 --period-days 2
done
for model in pm10-ispra-1min-rh-temp pm10-ispra-1min; do one $model 2 $model; done
