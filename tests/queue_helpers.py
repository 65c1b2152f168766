"""A migrated database with one member, and jobs put straight into its queue: for the queue's and the
placement's tests."""
from __future__ import annotations

import uuid

from lanner.core import db
from lanner.core.messages.device import Device
from lanner.core.models import Job, Role, User

GIB = 1024 ** 3
CPU = Device(kind="cpu", name="test cpu", memory_total_bytes=8 * GIB)


def make_db(url: str):
    db.migrate(url)
    factory = db.session_factory(url)
    with factory() as session:
        return factory, add_user(session)


def add_user(session) -> int:
    user = User(email=f"{uuid.uuid4().hex}@example.com", display_name="T", role=Role.member, password_hash="x")
    session.add(user)
    session.commit()
    return user.id


def add_job(session, owner_id: int, name: str, **fields) -> int:
    job = Job(owner_id=owner_id, name=name, method="lora", model="builtin/SmolLM2-135M-Instruct", **fields)
    session.add(job)
    session.commit()
    return job.id
