"""First-run setup, sign-in and sign-out, sessions, API tokens, users and roles."""
from __future__ import annotations

import hashlib

from sqlalchemy import select

from lanner.core import db
from lanner.core.models import ApiToken, User
from lanner.backend.security import SESSION_PREFIX, hash_password, verify_password

from backend_helpers import PASSWORD


def test_passwords_are_hashed_with_scrypt_and_salted():
    first, second = hash_password("s3cret pass"), hash_password("s3cret pass")
    assert first.startswith("scrypt$") and first != second and "s3cret" not in first
    assert verify_password("s3cret pass", first) and not verify_password("other pass", first)
    assert not verify_password("s3cret pass", "garbage")


def test_first_run_setup_creates_one_admin_then_is_refused(api_on_each_database):
    client = api_on_each_database.client()
    assert client.get("/api/setup").json() == {"needed": True}
    assert client.get("/api/me").status_code == 401
    short = client.post("/api/setup", json={"email": "ada@example.com", "display_name": "Ada", "password": "short"})
    assert short.status_code == 422 and short.json()["detail"][0]["loc"] == ["body", "password"]
    bad_email = client.post("/api/setup", json={"email": "not-an-email", "display_name": "Ada", "password": PASSWORD})
    assert bad_email.status_code == 422 and bad_email.json()["detail"][0]["loc"] == ["body", "email"]
    created = client.post("/api/setup", json={"email": "Ada@Example.com", "display_name": "Ada", "password": PASSWORD})
    assert created.status_code == 201, created.text
    assert created.json()["role"] == "admin" and created.json()["email"] == "ada@example.com"
    assert "password_hash" not in created.json()
    assert client.get("/api/me").json()["email"] == "ada@example.com"  # setup signs the admin in
    assert client.get("/api/setup").json() == {"needed": False}
    again = api_on_each_database.client().post(
        "/api/setup", json={"email": "eve@example.com", "display_name": "Eve", "password": PASSWORD})
    assert again.status_code == 409 and "already" in again.json()["detail"]
    with db.session_factory(api_on_each_database.settings.database_url)() as session:
        stored = session.scalar(select(User))
        assert stored.password_hash.startswith("scrypt$") and PASSWORD not in stored.password_hash


def test_the_session_cookie_is_httponly_lax_and_signing_out_ends_it(team):
    client = team.api.client()
    response = client.post("/api/auth/sign-in", json={"email": "alice@example.com", "password": PASSWORD})
    cookie = response.headers["set-cookie"]
    assert "lanner_session=" in cookie and "HttpOnly" in cookie and "SameSite=lax" in cookie
    assert "Secure" not in cookie  # plain http here; over https the cookie is Secure
    token = client.cookies["lanner_session"]
    assert team.api.redis.get(SESSION_PREFIX + hashlib.sha256(token.encode()).hexdigest()) == str(team.ids["alice"])
    assert client.get("/api/me").json()["email"] == "alice@example.com"
    assert client.post("/api/auth/sign-out").status_code == 204
    stolen = team.api.client()
    stolen.cookies.set("lanner_session", token)
    assert stolen.get("/api/me").status_code == 401


def test_the_cookie_is_secure_over_https(team):
    client = team.api.client()
    client.base_url = "https://testserver"
    response = client.post("https://testserver/api/auth/sign-in",
                           json={"email": "alice@example.com", "password": PASSWORD})
    assert "Secure" in response.headers["set-cookie"]


def test_sign_in_refuses_wrong_passwords_unknown_emails_and_deactivated_users(team):
    client = team.api.client()
    for email, password in (("alice@example.com", "wrong password"), ("nobody@example.com", PASSWORD)):
        response = client.post("/api/auth/sign-in", json={"email": email, "password": password})
        assert response.status_code == 401 and response.json() == {"detail": "Wrong email or password"}
    assert team.admin.patch(f"/api/users/{team.ids['bob']}", json={"is_active": False}).status_code == 200
    assert team.bob.get("/api/me").status_code == 401  # the open session stops working too
    assert client.post("/api/auth/sign-in", json={"email": "bob@example.com", "password": PASSWORD}).status_code == 401


def test_api_tokens_are_shown_once_stored_hashed_listed_and_revoked(team_on_each_database):
    team = team_on_each_database
    created = team.alice.post("/api/tokens", json={"name": "ci"})
    assert created.status_code == 201
    token = created.json()["token"]
    assert token.startswith("lnr_") and created.json()["prefix"] == token[:12]
    with db.session_factory(team.api.settings.database_url)() as session:
        row = session.scalar(select(ApiToken))
        assert row.token_hash == hashlib.sha256(token.encode()).hexdigest() and token not in row.token_hash
    script = team.api.client()
    me = script.get("/api/me", headers={"Authorization": f"Bearer {token}"})
    assert me.status_code == 200 and me.json()["email"] == "alice@example.com"
    listed = team.alice.get("/api/tokens").json()
    assert [t["name"] for t in listed] == ["ci"] and "token" not in listed[0] and listed[0]["last_used_at"]
    assert team.bob.get("/api/tokens").json() == []
    assert team.bob.delete(f"/api/tokens/{created.json()['id']}").status_code == 404  # not bob's
    assert team.alice.delete(f"/api/tokens/{created.json()['id']}").status_code == 204
    assert script.get("/api/me", headers={"Authorization": f"Bearer {token}"}).status_code == 401
    assert team.alice.get("/api/tokens").json()[0]["revoked_at"] is not None


def test_malformed_credentials_are_refused(team):
    client = team.api.client()
    for header in ("Bearer lnr_nope", "Bearer ", "Basic YWRhOnB3", "lnr_raw"):
        response = client.get("/api/me", headers={"Authorization": header})
        assert response.status_code == 401 and "detail" in response.json()
    client.cookies.set("lanner_session", "forged")
    assert client.get("/api/me").status_code == 401


def test_admins_create_users_members_cannot(team):
    new = {"email": "carol@example.com", "display_name": "Carol", "password": PASSWORD}
    assert team.anonymous.post("/api/users", json=new).status_code == 401
    assert team.alice.post("/api/users", json=new).status_code == 403
    created = team.admin.post("/api/users", json={**new, "role": "admin"})
    assert created.status_code == 201 and created.json()["role"] == "admin"
    assert team.admin.post("/api/users", json=new).status_code == 409
    emails = [user["email"] for user in team.alice.get("/api/users").json()]
    assert emails == ["ada@example.com", "alice@example.com", "bob@example.com", "carol@example.com"]
    assert team.alice.patch(f"/api/users/{team.ids['bob']}", json={"role": "admin"}).status_code == 403
    assert team.admin.patch("/api/users/999", json={"role": "admin"}).status_code == 404


def test_the_last_admin_cannot_be_demoted(team):
    response = team.admin.patch(f"/api/users/{team.ids['admin']}", json={"role": "member"})
    assert response.status_code == 409 and "last active admin" in response.json()["detail"]
    assert team.admin.patch(f"/api/users/{team.ids['alice']}", json={"role": "admin"}).json()["role"] == "admin"
    assert team.admin.patch(f"/api/users/{team.ids['admin']}", json={"role": "member"}).status_code == 200


def test_people_change_their_own_name_and_password(team):
    assert team.alice.patch("/api/me", json={"display_name": "Alice L."}).json()["display_name"] == "Alice L."
    assert team.alice.patch("/api/me", json={"password": "new password 1"}).status_code == 403
    assert team.alice.patch("/api/me", json={"role": "admin"}).status_code == 403
    changed = team.alice.patch("/api/me", json={"password": "new password 1", "current_password": PASSWORD})
    assert changed.status_code == 200
    assert team.api.signed_in("alice@example.com", "new password 1").get("/api/me").status_code == 200


def test_password_guessing_is_slowed_down(team):
    client = team.api.client()
    for _ in range(10):
        assert client.post("/api/auth/sign-in", json={"email": "bob@example.com", "password": "guess"}).status_code == 401
    blocked = client.post("/api/auth/sign-in", json={"email": "bob@example.com", "password": PASSWORD})
    assert blocked.status_code == 429 and int(blocked.headers["retry-after"]) > 0
    assert team.api.signed_in("alice@example.com").get("/api/me").status_code == 200  # others are not locked out
