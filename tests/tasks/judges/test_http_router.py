"""The OpenAI-compatible backend and the router, against a real HTTP server on loopback
(tests/fake_openai.py): retries, backoff, Retry-After, timeouts, fallback, explicit states,
concurrency bounds, identities, keys, model and image checks."""

from __future__ import annotations

import asyncio
import base64
import email.utils
import logging
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from schemas.lake import JUDGE_CALLS, VERDICTS
from tasks.judges import check_judges, judge_items, settled_identities
from tasks.judges.openai_compat import parse_retry_after, public_url
from tasks.judges.protocol import load_template
from tasks.judges.router import RetryPolicy
from tests.fake_openai import Reply, free_port
from tests.tasks.judges.helpers import FAST, Script, config, endpoint, make_routing

REPO = Path(__file__).resolve().parents[3]
PASS_TEXT = "The fox is clearly visible.\nVERDICT: PASS"
FAIL_TEXT = "There is no fox.\nVERDICT: FAIL"


def rows(table):
    return table.to_pylist()


def test_pass_and_fail_with_full_records(servers, make_item) -> None:
    srv = servers(responder=Script({"fox": [Reply(text=PASS_TEXT)], "cat": [Reply(text=FAIL_TEXT)]}))
    fox, cat = make_item("a red fox in the snow"), make_item("a cat on a sofa")
    calls, verdicts = judge_items(
        [fox, cat], make_routing("alpha", None), config(alpha=endpoint(srv, max_tokens=300)), retry=FAST
    )

    assert calls.schema.equals(JUDGE_CALLS) and verdicts.schema.equals(VERDICTS)
    by_prompt = {v["prompt_id"]: v for v in rows(verdicts)}
    assert by_prompt[fox.prompt_id]["verdict"] == "PASS" and by_prompt[cat.prompt_id]["verdict"] == "FAIL"
    v = by_prompt[fox.prompt_id]
    assert v["judge"] == "alpha" and v["judge_model"] == "fake-vlm" and v["source"] == "judged"
    assert v["rationale"] == "The fox is clearly visible." and v["reason"] is None
    assert v["template_sha256"] == load_template("verdict-v1").sha256
    assert v["sampling"] == '{"max_tokens":300,"seed":0,"temperature":0.0}'
    assert len(v["identity"]) == 64 and v["suite_version"] == "test-v1" and v["image_sha256"] == fox.image_sha256

    c = [r for r in rows(calls) if r["prompt_id"] == fox.prompt_id]
    assert len(c) == 1 and c[0]["outcome"] == "PASS" and c[0]["attempt"] == 1 and c[0]["error"] is None
    assert c[0]["raw_text"] == PASS_TEXT and c[0]["reported_model"] == "fake-vlm"
    assert c[0]["prompt_tokens"] == 321 and c[0]["completion_tokens"] == 12 and c[0]["latency_s"] > 0
    assert c[0]["endpoint"] == srv.base_url and c[0]["template"] == "verdict-v1"

    # what went over the wire: the image inline, temperature 0, fixed seed, max_tokens
    req = next(r for r in srv.completions if "fox" in r.generation_prompt)
    assert req.body["model"] == "fake-vlm" and req.body["temperature"] == 0 and req.body["seed"] == 0
    assert req.body["max_tokens"] == 300
    assert "Does the image show exactly" in req.user_text
    url = req.image_url
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == fox.image_path.read_bytes()


def test_429_with_retry_after_seconds_is_honoured(servers, make_item) -> None:
    srv = servers(responder=Script({"fox": [Reply(status=429, headers={"Retry-After": "1"}), Reply(text=PASS_TEXT)]}))
    calls, verdicts = judge_items(
        [make_item("a fox")], make_routing("alpha", None), config(alpha=endpoint(srv)), retry=FAST
    )
    first, second = srv.completions
    assert second.t - first.t >= 1.0  # FAST backoff alone would wait 0.01 s
    c = rows(calls)
    assert [r["outcome"] for r in c] == ["ERROR", "PASS"] and [r["attempt"] for r in c] == [1, 2]
    assert "HTTP 429" in c[0]["error"] and "Retry-After 1 s" in c[0]["error"]
    assert rows(verdicts)[0]["verdict"] == "PASS"


def test_429_with_retry_after_http_date_is_honoured(servers, make_item) -> None:
    when = email.utils.formatdate(time.time() + 2, usegmt=True)  # whole seconds: waits 1..2 s
    srv = servers(responder=Script({"fox": [Reply(status=429, headers={"Retry-After": when}), Reply(text=PASS_TEXT)]}))
    _, verdicts = judge_items(
        [make_item("a fox")], make_routing("alpha", None), config(alpha=endpoint(srv)), retry=FAST
    )
    first, second = srv.completions
    assert second.t - first.t >= 0.95
    assert rows(verdicts)[0]["verdict"] == "PASS"


def test_parse_retry_after() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)
    assert parse_retry_after("7", now) == 7.0
    assert parse_retry_after("1.5", now) == 1.5
    assert parse_retry_after(email.utils.format_datetime(now + timedelta(seconds=30), usegmt=True), now) == 30.0
    assert parse_retry_after(email.utils.format_datetime(now - timedelta(seconds=30), usegmt=True), now) == 0.0
    assert parse_retry_after("soon", now) is None and parse_retry_after(None, now) is None


def test_retry_after_longer_than_the_policy_allows_goes_to_fallback(servers, make_item) -> None:
    alpha = servers(responder=lambda r: Reply(status=503, headers={"Retry-After": "3600"}))
    beta = servers(responder=lambda r: Reply(text=PASS_TEXT))
    _, verdicts = judge_items(
        [make_item()], make_routing(), config(alpha=endpoint(alpha), beta=endpoint(beta)), retry=FAST
    )
    assert len(alpha.completions) == 1  # not retried: waiting an hour is not an option
    assert rows(verdicts)[0]["judge"] == "beta"


def test_500s_are_retried_with_exponential_backoff_then_fallback(servers, make_item) -> None:
    alpha = servers(responder=lambda r: Reply(status=500))
    beta = servers(responder=lambda r: Reply(text=PASS_TEXT))
    policy = RetryPolicy(backoff_base_s=0.1, backoff_max_s=10, jitter=0.0)
    calls, verdicts = judge_items(
        [make_item()], make_routing(), config(alpha=endpoint(alpha, max_retries=2), beta=endpoint(beta)), retry=policy
    )
    t = [r.t for r in alpha.completions]
    assert len(t) == 3  # 1 + max_retries
    assert t[1] - t[0] >= 0.1 and t[2] - t[1] >= 0.2  # 0.1, then 0.2: exponential
    c = rows(calls)
    assert [(r["judge"], r["attempt"], r["outcome"]) for r in c] == [
        ("alpha", 1, "ERROR"), ("alpha", 2, "ERROR"), ("alpha", 3, "ERROR"), ("beta", 1, "PASS")
    ]  # fmt: skip
    assert all("HTTP 500" in r["error"] for r in c[:3])
    v = rows(verdicts)[0]
    assert v["verdict"] == "PASS" and v["judge"] == "beta"


def test_timeouts_are_retried_then_fallback(servers, make_item) -> None:
    alpha = servers(responder=lambda r: Reply(hang_s=5))
    beta = servers(responder=lambda r: Reply(text=FAIL_TEXT))
    t0 = time.monotonic()
    calls, verdicts = judge_items(
        [make_item()],
        make_routing(),
        config(alpha=endpoint(alpha, timeout_s=0.3, max_retries=1), beta=endpoint(beta)),
        retry=FAST,
    )
    assert time.monotonic() - t0 < 4.5  # well under one 5 s hang: the 0.3 s timeout cut both tries
    c = rows(calls)
    assert [r["outcome"] for r in c] == ["ERROR", "ERROR", "FAIL"]
    assert all("timed out after 0.3 s" in r["error"] for r in c[:2])
    assert all(0.25 <= r["latency_s"] < 2 for r in c[:2])
    assert rows(verdicts)[0]["verdict"] == "FAIL" and rows(verdicts)[0]["judge"] == "beta"


def test_malformed_json_is_retried_a_bounded_number_of_times(servers, make_item) -> None:
    alpha = servers(
        responder=Script(
            {"fox": [Reply(body=b"{not json"), Reply(text=PASS_TEXT)], "cat": [Reply(body=b'{"choices": []}')]}
        )
    )
    beta = servers(responder=lambda r: Reply(text=FAIL_TEXT))
    fox, cat = make_item("a fox"), make_item("a cat")
    calls, verdicts = judge_items(
        [fox, cat],
        make_routing(),
        config(alpha=endpoint(alpha), beta=endpoint(beta)),
        retry=RetryPolicy(backoff_base_s=0.01, bad_response_retries=2),
    )
    c = rows(calls)
    fox_calls = [r for r in c if r["prompt_id"] == fox.prompt_id]
    assert [r["outcome"] for r in fox_calls] == ["ERROR", "PASS"] and "malformed JSON" in fox_calls[0]["error"]
    cat_calls = [r for r in c if r["prompt_id"] == cat.prompt_id]
    assert [(r["judge"], r["outcome"]) for r in cat_calls] == [("alpha", "ERROR")] * 3 + [("beta", "FAIL")]
    assert "no choices" in cat_calls[0]["error"]
    v = {r["prompt_id"]: r for r in rows(verdicts)}
    assert (v[fox.prompt_id]["judge"], v[fox.prompt_id]["verdict"]) == ("alpha", "PASS")
    assert (v[cat.prompt_id]["judge"], v[cat.prompt_id]["verdict"]) == ("beta", "FAIL")


def test_unparsable_is_reasked_then_sent_to_fallback(servers, make_item) -> None:
    alpha = servers(responder=lambda r: Reply(text="Yes, I think the fox is there."))
    beta = servers(responder=lambda r: Reply(text=PASS_TEXT))
    calls, verdicts = judge_items(
        [make_item()],
        make_routing(unparsable_retries=2),
        config(alpha=endpoint(alpha), beta=endpoint(beta)),
        retry=FAST,
    )
    assert len(alpha.completions) == 3 and len(beta.completions) == 1
    assert [(r["judge"], r["outcome"]) for r in rows(calls)] == [("alpha", "UNPARSABLE")] * 3 + [("beta", "PASS")]
    assert rows(calls)[0]["raw_text"] == "Yes, I think the fox is there."
    assert rows(verdicts)[0]["verdict"] == "PASS" and rows(verdicts)[0]["judge"] == "beta"


def test_explicit_states_when_both_judges_fail(servers, make_item) -> None:
    chatty = servers(responder=lambda r: Reply(text="Hard to say.\nVERDICT: MAYBE"))
    broken = servers(responder=lambda r: Reply(status=500))
    dead = f"http://127.0.0.1:{free_port()}/v1"
    from schemas.judges import Endpoint

    cases = {
        "both-unparsable": (endpoint(chatty), endpoint(chatty, model=chatty.model), "UNPARSABLE"),
        "both-500": (endpoint(broken, max_retries=1), endpoint(broken, max_retries=1), "ERROR"),
        "unparsable-then-dead": (
            endpoint(chatty),
            Endpoint(backend="openai", base_url=dead, model="m", timeout_s=2),
            "UNPARSABLE",
        ),
    }
    for name, (a, b, expected) in cases.items():
        _, verdicts = judge_items([make_item()], make_routing(), config(alpha=a, beta=b), retry=FAST)
        v = rows(verdicts)[0]
        assert v["verdict"] == expected, name
        assert "alpha:" in v["reason"] and "beta:" in v["reason"], name
        assert v["rationale"] is None
    # no fallback at all, and the only judge is down
    _, verdicts = judge_items(
        [make_item()],
        make_routing("alpha", None),
        config(alpha=Endpoint(backend="openai", base_url=dead, model="m")),
        retry=FAST,
    )
    v = rows(verdicts)[0]
    assert v["verdict"] == "ERROR" and "cannot connect" in v["reason"] and v["judge"] == "alpha"


def test_connection_refused_takes_the_judge_out_of_the_run(servers, make_item) -> None:
    from schemas.judges import Endpoint

    beta = servers(responder=lambda r: Reply(text=PASS_TEXT))
    dead = Endpoint(backend="openai", base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", max_retries=3)
    items = [make_item() for _ in range(4)]
    calls, verdicts = judge_items(
        items, make_routing(), config(alpha=dead, beta=endpoint(beta)), retry=FAST, max_active_items=1
    )
    alpha_calls = [r for r in rows(calls) if r["judge"] == "alpha"]
    assert len(alpha_calls) == 1 and "cannot connect" in alpha_calls[0]["error"]  # no retries, then not asked again
    assert [v["verdict"] for v in rows(verdicts)] == ["PASS"] * 4 and {v["judge"] for v in rows(verdicts)} == {"beta"}


def test_concurrency_is_bounded_per_endpoint_and_endpoints_run_together(servers, make_item) -> None:
    alpha = servers(responder=lambda r: Reply(text=PASS_TEXT, delay_s=0.15))
    beta = servers(responder=lambda r: Reply(text=FAIL_TEXT, delay_s=0.15))
    routing = make_routing("alpha", None, Human_Realism={"preferred": "beta"})
    items = [make_item(category="Spatial Reasoning") for _ in range(12)] + [
        make_item(category="Human Realism") for _ in range(8)
    ]
    done: list[int] = []
    _, verdicts = judge_items(
        items, routing, config(alpha=endpoint(alpha, concurrency=3), beta=endpoint(beta, concurrency=2)),
        retry=FAST, progress=done.append,
    )  # fmt: skip
    assert alpha.max_in_flight == 3 and beta.max_in_flight == 2  # bounded, and the bound is reached
    assert len(alpha.completions) == 12 and len(beta.completions) == 8 and sum(done) == 20
    # the two endpoints worked at the same time
    a0, a1 = min(r.t for r in alpha.completions), max(r.t_end for r in alpha.completions)
    b0, b1 = min(r.t for r in beta.completions), max(r.t_end for r in beta.completions)
    assert max(a0, b0) < min(a1, b1)
    assert sorted(v["verdict"] for v in rows(verdicts)) == ["FAIL"] * 8 + ["PASS"] * 12


def test_known_identities_are_never_requested_again_unless_rejudge(servers, make_item) -> None:
    srv = servers(responder=Script({"broken": [Reply(status=500)]}, default=Reply(text=PASS_TEXT)))
    items = [make_item("a fox"), make_item("a cat"), make_item("a broken vase")]
    routing, cfg = make_routing("alpha", None), config(alpha=endpoint(srv, max_retries=0))
    first = judge_items(items, routing, cfg, retry=FAST)
    assert sorted(v["verdict"] for v in rows(first.verdicts)) == ["ERROR", "PASS", "PASS"]
    n = len(srv.completions)
    known = settled_identities(first.verdicts)
    assert len(known) == 2  # ERROR is not settled: the next run tries it again

    srv.responder = lambda r: Reply(text=PASS_TEXT)
    second = judge_items(items, routing, cfg, known_identities=known, retry=FAST)
    assert len(srv.completions) == n + 1  # only the ERROR item
    assert len(second.skipped) == 2 and rows(second.verdicts)[0]["prompt_id"] == items[2].prompt_id

    known |= settled_identities(second.verdicts)
    third = judge_items(items, routing, cfg, known_identities=known, retry=FAST)
    assert len(srv.completions) == n + 1 and third.calls.num_rows == 0 and third.verdicts.num_rows == 0
    assert len(third.skipped) == 3

    forced = judge_items(items, routing, cfg, known_identities=known, rejudge=True, retry=FAST)
    assert len(srv.completions) == n + 4 and forced.verdicts.num_rows == 3
    assert set(forced.verdicts.column("identity").to_pylist()) == known  # same identity, asked again

    # another judge model is another identity: asked again without --rejudge
    other = servers(model="fake-vlm-2", responder=lambda r: Reply(text=PASS_TEXT))
    judge_items(items, routing, config(alpha=endpoint(other)), known_identities=known, retry=FAST)
    assert len(other.completions) == 3


def test_api_key_reaches_the_server_and_nowhere_else(servers, make_item, monkeypatch, caplog) -> None:
    key = "sk-test-9f8e7d6c5b4a-SECRET"
    monkeypatch.setenv("FAKE_JUDGE_API_KEY", key)
    srv = servers(api_key=key, responder=Script({"error": [Reply(status=400, body=f'{{"error": "bad {key}"}}'.encode())]},
                                                default=Reply(text=PASS_TEXT)))  # fmt: skip
    wrong = servers(api_key="another-key", responder=lambda r: Reply(text=PASS_TEXT))
    caplog.set_level(logging.DEBUG)
    items = [make_item("a fox"), make_item("an error echo")]
    ep = endpoint(srv, api_key_env="FAKE_JUDGE_API_KEY")
    calls, verdicts = judge_items(items, make_routing("alpha", None), config(alpha=ep), retry=FAST)
    assert all(r.headers.get("Authorization") == f"Bearer {key}" for r in srv.completions)
    assert sorted(v["verdict"] for v in rows(verdicts)) == ["ERROR", "PASS"]

    # a server refusing the key: a clear error naming the variable, never the key
    calls2, verdicts2 = judge_items(
        [make_item()],
        make_routing("alpha", None),
        config(alpha=endpoint(wrong, api_key_env="FAKE_JUDGE_API_KEY")),
        retry=FAST,
    )
    assert "HTTP 401" in rows(verdicts2)[0]["reason"] and "FAKE_JUDGE_API_KEY" in rows(verdicts2)[0]["reason"]
    # the variable unset: no request is sent
    monkeypatch.delenv("FAKE_JUDGE_API_KEY")
    n = len(srv.completions)
    _, verdicts3 = judge_items([make_item()], make_routing("alpha", None), config(alpha=ep), retry=FAST)
    assert len(srv.completions) == n and "FAKE_JUDGE_API_KEY" in rows(verdicts3)[0]["reason"]
    rows_check = check_judges(config(alpha=ep))

    everything = [str(v) for t in (calls, verdicts, calls2, verdicts2, verdicts3) for r in rows(t) for v in r.values()]
    everything += [str(v) for r in rows_check for v in r.values()]
    everything += [caplog.text, repr(ep), repr(config(alpha=ep))]
    assert not [s for s in everything if key in s]
    assert any("***" in s for s in everything)  # the server echoed the key in a 400 body: redacted


def test_a_judge_answering_for_another_model_is_an_error(servers, make_item) -> None:
    alpha = servers(responder=lambda r: Reply(text=PASS_TEXT, model="some-other-model"))
    beta = servers(responder=lambda r: Reply(text=FAIL_TEXT))
    items = [make_item(), make_item()]
    calls, verdicts = judge_items(
        items, make_routing(), config(alpha=endpoint(alpha), beta=endpoint(beta)), retry=FAST, max_active_items=1
    )
    alpha_calls = [r for r in rows(calls) if r["judge"] == "alpha"]
    assert len(alpha_calls) == 1  # not retried, and not asked again in this run
    err = alpha_calls[0]["error"]
    assert "answers for another model" in err and "'fake-vlm'" in err and "'some-other-model'" in err
    assert {(v["judge"], v["verdict"]) for v in rows(verdicts)} == {("beta", "FAIL")}
    # and without a fallback the item is an explicit ERROR naming both models
    _, verdicts = judge_items([make_item()], make_routing("alpha", None), config(alpha=endpoint(alpha)), retry=FAST)
    assert rows(verdicts)[0]["verdict"] == "ERROR" and "some-other-model" in rows(verdicts)[0]["reason"]


def test_an_image_over_the_judge_limit_is_a_clear_error_and_nothing_is_sent(servers, make_item) -> None:
    srv = servers(responder=lambda r: Reply(text=PASS_TEXT))
    item = make_item(size=(300, 120))
    calls, verdicts = judge_items(
        [item], make_routing("alpha", None), config(alpha=endpoint(srv, max_image_side=256)), retry=FAST
    )
    assert srv.completions == []
    v = rows(verdicts)[0]
    assert v["verdict"] == "ERROR"
    assert str(item.image_path) in v["reason"] and "300x120" in v["reason"] and "max_image_side 256" in v["reason"]
    assert rows(calls)[0]["attempt"] == 1 and len(rows(calls)) == 1  # not retried


def test_an_image_that_changed_since_ingest_is_refused(servers, make_item) -> None:
    srv = servers()
    item = make_item()
    item.image_path.write_bytes(item.image_path.read_bytes() + b"tampered")
    _, verdicts = judge_items([item], make_routing("alpha", None), config(alpha=endpoint(srv)), retry=FAST)
    assert srv.completions == [] and "changed since ingest" in rows(verdicts)[0]["reason"]


def test_routes_to_unconfigured_judges_leave_items_not_judged(make_item) -> None:
    items = [make_item(category="Spatial Reasoning"), make_item(category="Truthfulness")]
    run = judge_items(items, make_routing(), None, retry=FAST)
    assert run.calls.num_rows == 0 and run.verdicts.num_rows == 0
    assert len(run.not_judged) == 2 and all("not configured" in r[2] for r in run.not_judged)


def test_judge_items_works_inside_a_running_event_loop(servers, make_item) -> None:
    srv = servers(responder=lambda r: Reply(text=PASS_TEXT))

    async def caller():
        return judge_items([make_item()], make_routing("alpha", None), config(alpha=endpoint(srv)), retry=FAST)

    _, verdicts = asyncio.run(caller())
    assert rows(verdicts)[0]["verdict"] == "PASS"


def test_check_judges_reports_who_answers_with_which_model(servers) -> None:
    from schemas.judges import Endpoint

    good = servers(model="fake-vlm")
    other = servers(model="another-vlm")
    dead = Endpoint(backend="openai", base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", timeout_s=2)
    result = {
        r["judge"]: r
        for r in check_judges(config(good=endpoint(good), other=endpoint(other, model="fake-vlm"), dead=dead))
    }
    assert result["good"]["ok"] and result["good"]["reported_model"] == "fake-vlm"
    assert (
        not result["other"]["ok"]
        and "another model" in result["other"]["detail"]
        and "another-vlm" in result["other"]["detail"]
    )
    assert not result["dead"]["ok"] and "cannot connect" in result["dead"]["detail"]
    assert "ocr" in result and result["ocr"]["backend"] == "ocr"


def test_same_model_rules() -> None:
    from tasks.judges.openai_compat import same_model

    assert same_model("Qwen/Qwen3-VL-8B-Instruct", "Qwen/Qwen3-VL-8B-Instruct")
    assert same_model("gemma3", "gemma3:latest")  # Ollama's default tag
    assert same_model("gpt-4o", "gpt-4o-2024-08-06")  # OpenAI dated snapshot
    assert not same_model("gpt-4o", "gpt-4o-mini-2024-07-18")
    assert not same_model("gpt-4o", "gpt-4o-mini")
    assert not same_model("gemma3:27b", "gemma3:4b")
    assert not same_model("Qwen/Qwen3-VL-8B-Instruct", "qwen/qwen3-vl-8b-instruct")


def test_public_url_drops_credentials_and_query() -> None:
    assert public_url("https://user:pw@api.example.com:8443/v1/?key=abc#x") == "https://api.example.com:8443/v1"


def test_make_items_from_the_suite_and_image_rows(tmp_path) -> None:
    from tasks.judges import make_items
    from tasks.scores.suite import load_suite
    from tests.tasks.judges.helpers import write_image

    suite = load_suite(REPO / "reference" / "suite-imagebench-v1.jsonl")
    (tmp_path / "images").mkdir()
    _, sha = write_image(tmp_path / "images" / "a.png")
    rows_ = [
        {"prompt_id": "tr-signage-01", "state": "ok", "image_path": "images/a.png", "image_sha256": sha},
        {"prompt_id": "tr-signage-02", "state": "missing", "image_path": None, "image_sha256": None},
    ]
    (item,) = make_items(suite, "model-a", rows_, image_root=tmp_path)
    assert item.image_path == tmp_path / "images" / "a.png" and item.category == "Text Rendering"
    assert item.suite_version == "imagebench-v1" and '"FRESH EGGS"' in item.prompt and item.question.endswith("?")
