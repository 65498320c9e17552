#!/bin/sh
# The rounds reported in attack/README.md, one configuration after another (one host at a time).
# usage: sh attack/campaign.sh OUT.jsonl ; summarize: python attack/summary.py OUT.jsonl
OUT=${1:-/tmp/attpg-rounds.jsonl}
PY=${PY:-/work/main/.venv/bin/python}
run() { echo "== $*" >> "$OUT"; PYTHONPATH=. $PY attack/stall_rounds.py "$@" >> "$OUT" 2>&1; }
run 3 --target backends --action close --seed 21 --limit 45
run 3 --target backends --action int --seed 22 --limit 45
run 2 --target postmaster --action mix --seed 23 --limit 60
run 2 --target pooler --action mix --seed 24 --limit 60
run 2 --target backends --front aio --action mix --seed 25 --limit 45
run 2 --target backends --action close --resume-at 1.9 --seed 26 --limit 45
run 2 --target backends --action close --resume-at 2.1 --seed 27 --limit 45
