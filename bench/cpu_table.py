"""The CPU rows of bench/flood.sh and bench/h2.sh as a table.

Reads lines of "ROW|PROXY_NAME|requests/s|CPU µs per request|of which system µs", one per
row, proxy and round, in the order measured, and prints each row's medians and each other
line's ratio to the "nginx, 1 limit" line of the same round.
"""
import statistics
import sys

cpu_file, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for line in open(cpu_file):
    row, name, rps, cpu, system = line.rstrip("\n").split("|")
    rows.setdefault(row, {}).setdefault(name, []).append((float(rps), float(cpu), float(system)))
print(f"\nmedians of {rounds} rounds; ratios: CPU per request ÷ nginx's, per round\n")
print("| row | proxy | requests/s | CPU µs/request | of which system | ÷ nginx per round "
      "| ÷ nginx (median) |")
print("|---|---|---:|---:|---:|---|---:|")
for row, names in rows.items():
    nginx = [cpu for _, cpu, _ in names["nginx, 1 limit"]]
    for name, runs in names.items():
        rps = statistics.median(r for r, _, _ in runs)
        cpu = statistics.median(c for _, c, _ in runs)
        system = statistics.median(s for _, _, s in runs)
        if name.startswith("nginx"):
            per_round, median = "—", "—"
        else:
            ratios = [c / n for (_, c, _), n in zip(runs, nginx)]
            per_round = ", ".join(f"{r:.2f}" for r in ratios)
            median = f"{statistics.median(ratios):.2f}×"
        print(f"| {row} | {name} | {rps:,.0f} | {cpu:.2f} | {system:.2f} | {per_round} "
              f"| {median} |")
