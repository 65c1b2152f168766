"""Passwords (scrypt from the standard library), browser sessions and API tokens.

Sessions live in Redis, not in a signed cookie: the cookie holds a random token, Redis holds
`lanner:session:<sha256(token)>` -> user id with an expiry. Signing out deletes the key, so a
stolen cookie stops working at once, and there is no signing secret to generate, share between
API replicas or rotate. Only hashes of session and API tokens are ever stored."""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from redis import Redis

# OWASP's minimum for scrypt (128 MiB, about a quarter second here). The parameters travel inside
# each hash, so raising them later leaves old hashes verifiable; tests lower SCRYPT_N for speed.
SCRYPT_N = 2**17
SCRYPT_R = 8
SCRYPT_P = 1
MIN_PASSWORD_LENGTH = 8

SESSION_COOKIE = "lanner_session"
SESSION_PREFIX = "lanner:session:"
# Per user, the keys of their sessions, so a password change, a reset or a deactivation ends them all.
USER_SESSIONS_PREFIX = "lanner:user-sessions:"
API_TOKEN_PREFIX = "lnr_"


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=256 * 1024**2, dklen=32)


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${b64(salt)}${b64(digest)}"


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        actual = _scrypt(password, base64.b64decode(salt), int(n), int(r), int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, base64.b64decode(digest))


def is_same_origin(origin: str, host: str) -> bool:
    """Whether a browser's Origin header names the host the request was sent to (scheme aside)."""
    return origin.split("://", 1)[-1].rstrip("/") == host


def sha256_hex(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_api_token() -> str:
    return API_TOKEN_PREFIX + secrets.token_urlsafe(32)


def _session_key(token: str) -> str:
    return SESSION_PREFIX + sha256_hex(token)


def open_session(redis: Redis, user_id: int, days: int) -> str:
    token = secrets.token_urlsafe(32)
    index = USER_SESSIONS_PREFIX + str(user_id)
    with redis.pipeline() as pipe:  # the index lives as long as the newest session it lists
        pipe.set(_session_key(token), str(user_id), ex=days * 86400)
        pipe.sadd(index, _session_key(token)).expire(index, days * 86400).execute()
    return token


def session_user_id(redis: Redis, token: str) -> int | None:
    value = redis.get(_session_key(token))
    return int(value) if value else None


def close_session(redis: Redis, token: str) -> None:
    user_id = session_user_id(redis, token)
    redis.delete(_session_key(token))
    if user_id is not None:
        redis.srem(USER_SESSIONS_PREFIX + str(user_id), _session_key(token))


def close_sessions_of(redis: Redis, user_id: int, keep: str | None = None) -> None:
    """Ends every browser session of a user but `keep` (the token of the session that asked)."""
    index = USER_SESSIONS_PREFIX + str(user_id)
    kept = _session_key(keep) if keep else None
    ended = [key for key in redis.smembers(index) if (key.decode() if isinstance(key, bytes) else key) != kept]
    if ended:
        with redis.pipeline() as pipe:
            pipe.delete(*ended).srem(index, *ended).execute()
