"""A reference collector written the way NeMo Gym's `ng_collect_rollouts` is (for the benchmark).

asyncio + one aiohttp session, every row read into memory first, one task per row behind a
semaphore, results kept in memory and written to a file in completion order, the metrics
printed at the end. Usage: reference_collector.py URL INPUT OUTPUT CONCURRENCY
"""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp


async def main(url: str, input_path: str, output_path: str, concurrency: int) -> None:
    source = sys.stdin if input_path == "-" else open(input_path)
    rows = [json.loads(line) for line in source if line.strip()]
    semaphore = asyncio.Semaphore(concurrency)
    results = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:

        async def run_one(index: int, row: dict) -> dict:
            async with semaphore:
                async with session.post(url, json=row) as response:
                    response.raise_for_status()
                    result = await response.json()
                result["_ng_task_index"] = index
                result["_ng_rollout_index"] = 0
                return result

        with open(output_path, "w") as output:
            for future in asyncio.as_completed([run_one(i, row) for i, row in enumerate(rows)]):
                result = await future
                results.append(result)
                output.write(json.dumps(result) + "\n")
                output.flush()
    rewards = [r["reward"] for r in results if "reward" in r]
    print(json.dumps({"reward": sum(rewards) / max(len(rewards), 1), "rows": len(results)}), file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
