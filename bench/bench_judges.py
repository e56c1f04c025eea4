"""Judge throughput: the router at the configured concurrency vs a sequential loop.

Both run the same code path (`tasks.judges.judge_items`) against the same local
OpenAI-compatible server (tests/fake_openai.py) answering every request after a fixed delay;
only the endpoint's concurrency differs (1 = one request in flight at a time, the way most
evaluation harnesses call a judge). The ratio should approach the concurrency factor.

    .venv/bin/python bench/bench_judges.py [--latency 0.2] [--concurrency 16] [--items 200]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PIL import Image  # noqa: E402

from schemas.judges import Endpoint, JudgesConfig, Route, Routing  # noqa: E402
from schemas.suite import CATEGORIES  # noqa: E402
from tasks.judges import JudgeItem, judge_items  # noqa: E402
from tests.fake_openai import FakeOpenAI, Reply  # noqa: E402


def make_items(n: int, folder: Path) -> list[JudgeItem]:
    items = []
    for i in range(n):
        buf = io.BytesIO()
        Image.new("RGB", (128, 128), (i % 256, (7 * i) % 256, 90)).save(buf, format="PNG")
        data = buf.getvalue()
        path = folder / f"img-{i}.png"
        path.write_bytes(data)
        items.append(
            JudgeItem(
                model_id="bench", prompt_id=f"p-{i:04d}", suite_version="bench", category=CATEGORIES[1],
                image_path=path, image_sha256=hashlib.sha256(data).hexdigest(),
                prompt=f"A photo number {i}", question=f"Is this photo number {i}?",
            )
        )
    return items


def run(items: list[JudgeItem], base_url: str, concurrency: int) -> float:
    routing = Routing(version="bench", routes={c: Route(preferred="bench-judge") for c in CATEGORIES})
    config = JudgesConfig(judges={"bench-judge": Endpoint(
        backend="openai", base_url=base_url, model="fake-vlm", concurrency=concurrency, max_retries=0, timeout_s=30)})
    t0 = time.perf_counter()
    out = judge_items(items, routing, config)
    elapsed = time.perf_counter() - t0
    verdicts = out.verdicts["verdict"].to_pylist()
    assert verdicts.count("PASS") == len(items), f"expected {len(items)} PASS, got {verdicts}"
    return len(items) / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=0.2, help="server delay per request, seconds")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--sequential-items", type=int, default=50, help="items for the sequential loop (it is slow)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(responder=lambda r: Reply(delay_s=args.latency)) as srv:
        items = make_items(args.items, Path(tmp))
        sequential = run(items[: args.sequential_items], srv.base_url, 1)
        concurrent = run(items, srv.base_url, args.concurrency)
        print(f"server latency {args.latency * 1000:.0f} ms per request")
        print(f"sequential loop (1 in flight), {args.sequential_items} items: {sequential:.2f} verdicts/s")
        print(f"router at concurrency {args.concurrency}, {args.items} items: {concurrent:.2f} verdicts/s "
              f"(max in flight seen by the server: {srv.max_in_flight})")
        print(f"ratio: {concurrent / sequential:.1f}x (ideal: {args.concurrency}x)")


if __name__ == "__main__":
    main()
