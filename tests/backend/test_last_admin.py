"""The last active admin stays one when two admins demote each other at the same moment (issue 24),
on SQLite and PostgreSQL; an operator who lost every admin gets one back with `lanner admin`."""
from __future__ import annotations

import io
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy.orm import Session

pytestmark = pytest.mark.timeout(60)


def test_two_admins_demoting_each_other_at_once_leave_one_admin(team_on_each_database, monkeypatch):
    team = team_on_each_database
    assert team.admin.patch(f"/api/users/{team.ids['alice']}", json={"role": "admin"}).status_code == 200
    # Both requests reach their commit together when nothing serialises them; a change that waits for
    # the other's lock gives up waiting here after a moment and commits alone.
    both_at_commit = threading.Barrier(2, timeout=3)
    commit = Session.commit

    def commit_together(session):
        try:
            both_at_commit.wait()
        except threading.BrokenBarrierError:
            pass
        commit(session)

    monkeypatch.setattr(Session, "commit", commit_together)
    with ThreadPoolExecutor(2) as pool:
        ada_demotes_alice = pool.submit(team.admin.patch, f"/api/users/{team.ids['alice']}", json={"role": "member"})
        alice_demotes_ada = pool.submit(team.alice.patch, f"/api/users/{team.ids['admin']}", json={"role": "member"})
        statuses = sorted([ada_demotes_alice.result().status_code, alice_demotes_ada.result().status_code])
    monkeypatch.setattr(Session, "commit", commit)
    assert statuses == [200, 409]
    roles = [user["role"] for user in team.bob.get("/api/users").json() if user["is_active"]]
    assert roles.count("admin") == 1


def test_an_operator_gets_an_admin_back_and_resets_a_password_with_the_cli(team_on_each_database, monkeypatch,
                                                                          capsys):
    from lanner.cli.main import main
    from lanner.core import db
    from lanner.core.models import Role, User

    team = team_on_each_database
    with db.session_factory(team.api.settings.database_url)() as session:  # what a lost race once left
        session.get(User, team.ids["admin"]).role = Role.member
        session.commit()
    assert team.admin.get("/api/users").status_code == 200 and \
        team.admin.post("/api/users", json={}).status_code == 403
    main(["admin", "promote", "Alice@Example.com"])
    assert "alice@example.com is an active admin" in capsys.readouterr().out
    assert team.alice.patch(f"/api/users/{team.ids['bob']}", json={"role": "admin"}).json()["role"] == "admin"

    monkeypatch.setattr("sys.stdin", io.StringIO("a new password 1\n"))
    main(["admin", "reset-password", "bob@example.com"])
    assert team.bob.get("/api/me").status_code == 401  # signed out everywhere
    assert team.api.signed_in("bob@example.com", "a new password 1").get("/api/me").status_code == 200
    with pytest.raises(SystemExit, match="No user"):
        main(["admin", "promote", "nobody@example.com"])
