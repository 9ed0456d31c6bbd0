"""The CPU rows of bench/flood.sh and bench/h2.sh as a table.

Reads lines of "ROW|PROXY_NAME|requests/s|CPU µs per request", one per row, proxy and round,
in the order measured, and prints each row's medians and each tollgate line's ratio to the
"nginx, 1 limit" line of the same round.
"""
import statistics
import sys

cpu_file, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for line in open(cpu_file):
    row, name, rps, cpu = line.rstrip("\n").split("|")
    rows.setdefault(row, {}).setdefault(name, []).append((float(rps), float(cpu)))
print(f"\nmedians of {rounds} rounds; ratios: tollgate's CPU per request ÷ nginx's, per round\n")
print("| row | proxy | requests/s | CPU µs/request | ÷ nginx per round | ÷ nginx (median) |")
print("|---|---|---:|---:|---|---:|")
for row, names in rows.items():
    nginx = [cpu for _, cpu in names["nginx, 1 limit"]]
    for name, runs in names.items():
        rps = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        if name.startswith("nginx"):
            per_round, median = "—", "—"
        else:
            ratios = [c / n for (_, c), n in zip(runs, nginx)]
            per_round = ", ".join(f"{r:.2f}" for r in ratios)
            median = f"{statistics.median(ratios):.2f}×"
        print(f"| {row} | {name} | {rps:,.0f} | {cpu:.2f} | {per_round} | {median} |")
