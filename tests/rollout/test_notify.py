"""Webhooks against a real loopback HTTP receiver; a closed port stands for a dead receiver."""

import pytest

from ddops.rollout.fleet.loop import Limits, Rollout
from ddops.rollout.fleet.notify import Notifier, NotifyError, webhooks
from tests.rollout.test_fleet_loop import Hosts, make
from tests.rollout.webhook_receiver import Receiver
from tests.server_process import free_port


def events(*kinds):
    return [{"event": k, "profile": "p", "wave": 0, "hosts": ["h1"], "status": "succeeded"} for k in kinds]


def test_every_event_arrives_in_order_in_both_payloads():
    with Receiver() as receiver:
        hooks = webhooks([{"url": receiver.url + "/slack", "format": "slack"},
                          {"url": receiver.url + "/json"}], "plan.yaml")
        notifier = Notifier(hooks)
        for event in events("start", "wave", "finish"):
            notifier.send(event)
        reports = notifier.close()
    slack = [body for path, body in receiver.received if path == "/slack"]
    generic = [body for path, body in receiver.received if path == "/json"]
    assert [b["event"] for b in generic] == ["start", "wave", "finish"]
    assert [set(b) for b in slack] == [{"text"}] * 3
    assert slack[1]["text"] == "ddops rollout p: wave 0 started on h1"
    assert [r["sent"] for r in reports] == [3, 3] and all(not r["failed"] for r in reports)


def test_retries_with_backoff_then_delivers():
    with Receiver(fail_first=2) as receiver:
        notifier = Notifier(webhooks([{"url": receiver.url}], "p"), backoff_s=0.05)
        notifier.send(events("start")[0])
        report, = notifier.close()
    assert receiver.attempts == 3 and report["sent"] == 1 and not report["failed"]


def test_unreachable_webhook_is_reported_and_changes_no_outcome(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    with Receiver() as receiver:
        hooks = webhooks([{"url": dead}, {"url": receiver.url}], "p")
        notifier = Notifier(hooks, backoff_s=0.05)
        _, state, store = make(tmp_path, ["h1", "h2", "h3"])
        final = Rollout(state, store, Limits(0, 0.0, 4), Hosts().deploy, Hosts().revert,
                        on_event=lambda kind, fields: notifier.send({"event": kind, "profile": "p", **fields})).run()
        dead_report, live_report = notifier.close()
    assert final.status == "succeeded"
    kinds = [body["event"] for _, body in receiver.received]
    assert kinds == ["wave", "wave_done", "wave", "wave_done", "finish"]
    assert dead_report["sent"] == 0 and len(dead_report["failed"]) == 5
    assert "ConnectError after 3 attempt(s)" in dead_report["failed"][0]
    assert dead_report["webhook"] == f"http://127.0.0.1:{dead.split(':')[2].split('/')[0]}"


def test_secret_urls_come_from_the_environment_and_are_never_shown():
    hook, = webhooks([{"url_env": "HOOK_URL", "format": "slack"}], "p",
                     environ={"HOOK_URL": "https://hooks.example/services/T0/B0/secret"})
    assert hook.url.endswith("/secret") and hook.label == "$HOOK_URL"
    with pytest.raises(NotifyError, match="HOOK_URL is not set"):
        webhooks([{"url_env": "HOOK_URL"}], "p", environ={})
    with pytest.raises(NotifyError, match="exactly one of url, url_env"):
        webhooks([{"url": "http://a", "url_env": "B"}], "p")
    with pytest.raises(NotifyError, match="format"):
        webhooks([{"url": "http://a", "format": "teams"}], "p")
