#!/bin/sh
# The rounds reported in attack/README.md, one configuration after another (one host at a time).
# usage: sh attack/campaign.sh OUT.jsonl
OUT=${1:-/tmp/attpg-rounds.jsonl}
PY=${PY:-/work/main/.venv/bin/python}
run() { echo "== $*" >> "$OUT"; PYTHONPATH=. $PY attack/stall_rounds.py "$@" >> "$OUT" 2>&1; }
run 5 --target backends --action close --seed 21
run 5 --target backends --action int --seed 22
run 4 --target postmaster --action mix --seed 23 --limit 90
run 4 --target pooler --action mix --seed 24 --limit 90
run 4 --target backends --front aio --action mix --seed 25
run 4 --target backends --action close --resume-at 1.9 --seed 26
run 4 --target backends --action close --resume-at 2.1 --seed 27
