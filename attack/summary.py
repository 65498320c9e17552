"""Summarize a rounds file written by attack/stall_rounds.py (attack/campaign.sh): one line per round."""

import json, sys
for line in open(sys.argv[1]):
    if line.startswith("=="): print(line.strip()); continue
    try: o = json.loads(line)
    except Exception: print("  RAW", line[:300].strip()); continue
    print(f"  r{o['round']} {o['action']:5} exit {o.get('exit_s')}s rc {o.get('rc')} acked {o.get('acked')} unacked_landed {o.get('unacked_landed')} problems {o.get('problems')} verdict {o.get('verdict')}")
    if o.get('verdict') != 'ok':
        for l in o.get('log', []): print("     ", l[:170])
        if o.get('stack'): print("     STACK", [l.strip() for l in o['stack'].splitlines() if 'ctxrt/' in l][:10])
