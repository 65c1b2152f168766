"""How the API's sender sends webhooks, against real local HTTP(S) receivers: SENDERS at a time (a slow
receiver does not hold the others back), the log pruned to KEPT_DELIVERIES per webhook, and the POST
pinned to the address the check resolved (DNS rebinding), with the host's name in the Host header and
in TLS (SNI and the certificate's check)."""
from __future__ import annotations

import socket
import ssl
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from lanner.backend.notification_sender import KEPT_DELIVERIES, deliver_due
from lanner.core import db
from lanner.core.models import NotificationDelivery
from lanner.core import notifications
from lanner.core.notifications import DeliveryState, new_delivery

from support import WebhookReceiver


@pytest.fixture(autouse=True)
def private_targets(monkeypatch):
    monkeypatch.setenv("LANNER_WEBHOOK_PRIVATE_TARGETS", "true")  # the receivers listen on localhost


@pytest.fixture
def rebinding_dns(monkeypatch):
    """A resolver for the name hook.test whose first answer is 127.0.0.1 and every later one 127.0.0.2
    (where nothing listens): what a rebinding attacker's DNS does between a check and a connection."""
    real = socket.getaddrinfo
    asked = []

    def getaddrinfo(host, port, *args, **kwargs):
        if host != "hook.test":
            return real(host, port, *args, **kwargs)
        asked.append(host)
        address = "127.0.0.1" if len(asked) == 1 else "127.0.0.2"
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


def add_hook(team, url: str) -> dict:
    created = team.alice.post("/api/webhooks", json={"url": url, "events": ["finished"]})
    assert created.status_code == 201, created.text
    return created.json()


def queue_test(team, hook: dict) -> None:
    assert team.alice.post(f"/api/webhooks/{hook['id']}/test").status_code == 202


def test_a_slow_receiver_does_not_hold_back_the_others(team):
    release = threading.Event()
    slow, fast = WebhookReceiver(hold=release), WebhookReceiver()
    try:
        queue_test(team, add_hook(team, slow.url))  # due first
        queue_test(team, add_hook(team, fast.url))
        sending = threading.Thread(target=deliver_due, args=(team.api.settings,))
        sending.start()
        deadline = time.monotonic() + 10
        while not (fast.requests and slow.requests) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fast.requests and slow.requests and sending.is_alive()  # the slow one still has its answer to give
        release.set()
        sending.join(15)
    finally:
        release.set()
        slow.shutdown()
        fast.shutdown()
    with db.session_factory(team.api.settings.database_url)() as session:
        assert {row.state for row in session.query(NotificationDelivery)} == {DeliveryState.delivered}


def test_the_log_keeps_the_newest_deliveries_of_each_webhook(team):
    receiver = WebhookReceiver()
    try:
        hook, other = add_hook(team, receiver.url), add_hook(team, receiver.url)
        old = datetime.now(timezone.utc) - timedelta(days=1)
        with db.session_factory(team.api.settings.database_url)() as session:
            for _ in range(KEPT_DELIVERIES + 5):
                row = new_delivery(team.ids["alice"], hook["id"], None, "test", notifications.test_payload())
                row.state, row.delivered_at, row.next_try_at = DeliveryState.delivered, old, None
                session.add(row)
            for _ in range(3):
                row = new_delivery(team.ids["alice"], other["id"], None, "test", notifications.test_payload())
                row.state, row.next_try_at = DeliveryState.failed, None
                session.add(row)
            waiting = new_delivery(team.ids["alice"], hook["id"], None, "test", notifications.test_payload())
            waiting.next_try_at = datetime.now(timezone.utc) + timedelta(hours=1)  # pending: never pruned
            session.add(waiting)
            session.commit()
            oldest = min(row.id for row in session.query(NotificationDelivery))
        queue_test(team, hook)
        assert deliver_due(team.api.settings) == 1
        with db.session_factory(team.api.settings.database_url)() as session:
            rows = session.query(NotificationDelivery).all()
        finished = [row for row in rows if row.webhook_id == hook["id"] and row.state != DeliveryState.pending]
        assert len(finished) == KEPT_DELIVERIES and oldest not in {row.id for row in rows}
        newest = max(finished, key=lambda row: row.id)
        assert newest.payload["event"] == "test" and newest.attempts == 1  # the one just sent stays
        assert sum(row.webhook_id == other["id"] for row in rows) == 3 and waiting.id in {row.id for row in rows}
    finally:
        receiver.shutdown()


def test_the_post_goes_to_the_checked_address_with_the_hosts_name(team, rebinding_dns):
    receiver = WebhookReceiver()
    try:
        port = receiver.server_address[1]
        hook = add_hook(team, f"http://hook.test:{port}/in?from=lanner")  # saving resolves it: first answer
        del rebinding_dns[:]
        queue_test(team, hook)
        assert deliver_due(team.api.settings) == 1
        [delivery] = team.alice.get(f"/api/webhooks/{hook['id']}/deliveries").json()
        assert (delivery["state"], delivery["status_code"], delivery["error"]) == ("delivered", 200, None)
        assert rebinding_dns == ["hook.test"]  # resolved once per attempt: the connection asked no more
        [(headers, _)] = receiver.requests
        assert headers["Host"] == f"hook.test:{port}"
    finally:
        receiver.shutdown()


def test_https_names_the_host_in_tls_and_checks_its_certificate(team, rebinding_dns, tmp_path, monkeypatch):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=hook.test",
                    "-addext", "subjectAltName=DNS:hook.test", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    server_names = []
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    tls.sni_callback = lambda sock, name, context: server_names.append(name)
    receiver = WebhookReceiver(tls=tls)
    try:
        hook = add_hook(team, f"https://hook.test:{receiver.server_address[1]}/in")
        del rebinding_dns[:]
        queue_test(team, hook)
        assert deliver_due(team.api.settings) == 1  # the certificate is no one's the system trusts
        [refused] = team.alice.get(f"/api/webhooks/{hook['id']}/deliveries").json()
        assert refused["state"] == "pending" and "certificate verify failed" in refused["error"]
        assert server_names == ["hook.test"] and not receiver.requests

        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # now it is trusted: delivered, over the pinned address
        del rebinding_dns[:]
        assert deliver_due(team.api.settings, now=datetime.now(timezone.utc) + timedelta(minutes=1)) == 1
        [delivered] = team.alice.get(f"/api/webhooks/{hook['id']}/deliveries").json()
        assert (delivered["state"], delivered["error"]) == ("delivered", None)
        assert server_names == ["hook.test", "hook.test"] and rebinding_dns == ["hook.test"]
        assert receiver.requests[0][0]["Host"] == f"hook.test:{receiver.server_address[1]}"
    finally:
        receiver.shutdown()
