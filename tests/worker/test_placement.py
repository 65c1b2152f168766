"""Placement: a job goes to a device whose free memory fits it; a job on N devices reserves N idle
devices of one machine, all or nothing, through Redis, and the machine drains for it (the backfill
guard); a job on more devices than any machine has waits saying why; several CPU workers stand in for
GPUs (the placement logic is the same), run side by side and all show on the hardware stream and
/api/health."""
from __future__ import annotations

import socket

import pytest
from fastapi.testclient import TestClient

from lanner.core.messages.device import Device
from lanner.core.queue.order import QUEUE_ORDER
from lanner.core.models import Job, JobStatus
from lanner.core.queue.claim import claim_next_job, has_runnable_job, unclaim_job
from lanner.core.queue.waiting import waiting_reason
from lanner.core.settings import Settings, get_settings
from lanner.core.streams import HARDWARE_STREAM, QUEUE_STREAM, read_after
from lanner.core.worker_registry import (announce_worker, device_holders, keep_devices, live_workers,
                                            release_devices, reservation_key, reserve_devices, retire_worker)
from lanner.worker.devices import cpu_device
from lanner.worker import runner
from lanner.worker.runner import DeviceLease, _claim, idle_devices

from queue_helpers import GIB, add_job, make_db
from support import WORKER_REDIS_URL
from worker_helpers import qa_rows, queue_events

FAST = {"hyperparameters": {"max_steps": 2, "before_after_eval": False}}
GPU = Device(kind="cuda", name="test gpu", memory_total_bytes=80 * GIB, index=0, id="GPU-a", host="box")


def test_a_job_must_fit_the_free_memory_not_the_total(database_url):
    factory, owner = make_db(database_url)
    with factory() as session:
        big = add_job(session, owner, "big", priority=5, memory_estimate_bytes=10 * GIB)
        small = add_job(session, owner, "small", memory_estimate_bytes=4 * GIB)
    busy_gpu = GPU.with_free_memory(6 * GIB)  # another process holds 74 GiB of it
    with factory() as session:
        assert claim_next_job(session, "gpu0@box", busy_gpu).id == small
        assert claim_next_job(session, "gpu0@box", busy_gpu) is None
        assert claim_next_job(session, "gpu0@box", GPU.with_free_memory(79 * GIB)).id == big


def test_a_job_on_several_devices_needs_that_many_that_fit(database_url):
    factory, owner = make_db(database_url)
    with factory() as session:
        replicated = add_job(session, owner, "fits each device", gpus=2, priority=3, memory_estimate_bytes=6 * GIB)
        sharded = add_job(session, owner, "fits two halves", gpus=2, priority=2, memory_estimate_bytes=14 * GIB)
        add_job(session, owner, "too big even halved", gpus=2, priority=9, memory_estimate_bytes=20 * GIB)
        add_job(session, owner, "three devices", gpus=3, priority=9, memory_estimate_bytes=12 * GIB)
    own = GPU.with_free_memory(8 * GIB)
    with factory() as session:
        assert not has_runnable_job(session, own)  # alone, this device runs none of them
        assert claim_next_job(session, "gpu0@box", own) is None
        assert has_runnable_job(session, own, others=[8 * GIB])
        # The roomiest other device counts: the 2-GPU jobs fit 8 GiB + 9 GiB, not 8 + 3; the 3-GPU job
        # would need 3 x 4 GiB (FSDP) and the emptiest of the three has 3.
        assert claim_next_job(session, "gpu0@box", own, others=[3 * GIB, 9 * GIB]).id == replicated
        # Another worker was quicker to reserve the devices: the job goes back, first in the queue again.
        assert unclaim_job(session, replicated, "gpu0@box")
        assert not unclaim_job(session, replicated, "gpu0@box")
        assert claim_next_job(session, "gpu0@box", own, others=[8 * GIB], exclude=(replicated,)).id == sharded
        assert claim_next_job(session, "gpu1@box", own, others=[8 * GIB]).id == replicated
        assert claim_next_job(session, "gpu0@box", own, others=[8 * GIB]) is None
        waiting = [job.name for job in session.query(Job).filter(Job.status == JobStatus.queued).order_by(*QUEUE_ORDER)]
        assert waiting == ["too big even halved", "three devices"]


def test_a_machine_drains_for_the_first_job_on_several_devices_it_could_hold(database_url):
    """The backfill guard: jobs ranked behind a waiting job on several devices do not take the
    devices of a machine that could hold it, so its devices go idle one by one until the job fits."""
    factory, owner = make_db(database_url)
    with factory() as session:
        add_job(session, owner, "more devices than the machine", gpus=3, priority=9)
        add_job(session, owner, "more memory than the machine", gpus=2, priority=8, memory_estimate_bytes=200 * GIB)
        ahead = add_job(session, owner, "one device, ahead", priority=5)
        pair = add_job(session, owner, "two devices", gpus=2, priority=3, memory_estimate_bytes=6 * GIB)
        behind = [add_job(session, owner, f"one device, behind {i}", priority=1) for i in range(2)]
    own, box = GPU.with_free_memory(80 * GIB), [80 * GIB]  # the box's other GPU runs a job
    with factory() as session:
        assert claim_next_job(session, "gpu0@box", own, machine=box).id == ahead
        assert not has_runnable_job(session, own, machine=box)
        assert claim_next_job(session, "gpu0@box", own, machine=box) is None
        assert has_runnable_job(session, own)  # what it holds back
        # A machine of one GPU could never hold the pair: it goes on with the jobs behind.
        assert claim_next_job(session, "gpu0@small", own.model_copy(update={"id": "GPU-s"})).id == behind[0]
        # The box's other GPU is idle now: the pair takes both, then the queue goes on.
        assert claim_next_job(session, "gpu0@box", own, others=box, machine=box).id == pair
        assert claim_next_job(session, "gpu0@box", own, machine=box).id == behind[1]


def test_a_worker_leaves_its_device_idle_for_a_job_on_two_devices_until_its_machine_has_two(studio):
    redis = studio.redis
    own, other = cpu_device("cpu0@test"), cpu_device("cpu1@test")
    announce_worker(redis, "cpu1@test", other.with_free_memory(8 * GIB))
    dataset = studio.dataset("qa.jsonl", qa_rows(4))
    pair = studio.job(dataset, gpus=2, priority=1)
    single = studio.job(dataset)
    sessions = _sessions(studio)
    assert reserve_devices(redis, [other.id], "cpu1@test")  # cpu1 runs a job
    with DeviceLease(redis, "cpu0@test") as lease:
        assert lease.take([own.id])
        assert _claim(sessions, redis, "cpu0@test", own, lease, set()) is None
    assert studio.get_job(single).status == JobStatus.queued

    release_devices(redis, [other.id], "cpu1@test")  # cpu1's job ended
    with DeviceLease(redis, "cpu0@test") as lease:
        assert lease.take([own.id])
        job, placement = _claim(sessions, redis, "cpu0@test", own, lease, set())
        assert job.id == pair and [d.id for d in placement.devices] == [own.id, other.id]


def test_workers_say_why_a_job_on_more_devices_than_any_machine_waits(studio):
    redis = studio.redis
    settings = Settings(data_dir=studio.data_dir, database_url=studio.database_url, redis_url=WORKER_REDIS_URL)
    devices = [cpu_device(f"cpu{i}@test") for i in range(3)]
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(4)), gpus=3,
                        error=waiting_reason(3, 0))  # queued while no worker was live
    for i in (0, 1):
        announce_worker(redis, f"cpu{i}@test", devices[i])
    assert runner.run_queue(settings, "cpu0@test", devices[0]) == []
    job = studio.get_job(job_id)
    assert (job.status, job.error) == (JobStatus.queued, "Waiting: needs 3 GPUs, the largest machine has 2.")
    events = [(kind, data["job_id"], data["error"]) for _, kind, data in read_after(redis, QUEUE_STREAM)]
    assert events == [("waiting", job_id, job.error)]

    announce_worker(redis, "cpu2@test", devices[2])  # a third device, busy: the job fits the machine now
    assert reserve_devices(redis, [devices[2].id], "cpu2@test")
    assert runner.run_queue(settings, "cpu0@test", devices[0]) == []
    assert studio.get_job(job_id).error is None

    retire_worker(redis, "cpu2@test")  # its machine is gone: the janitor's sweep says so again
    assert runner.sweep_orphans(settings) == []
    assert studio.get_job(job_id).error == "Waiting: needs 3 GPUs, the largest machine has 2."


def test_device_reservations_are_all_or_nothing_and_only_their_holder_frees_them(studio):
    redis = studio.redis
    assert reserve_devices(redis, ["GPU-a", "GPU-b"], "gpu0@box")
    assert not reserve_devices(redis, ["GPU-b", "GPU-c"], "gpu2@box")
    assert device_holders(redis, ["GPU-a", "GPU-b", "GPU-c"]) == {"GPU-a": "gpu0@box", "GPU-b": "gpu0@box"}
    assert reserve_devices(redis, ["GPU-a"], "gpu0@box")  # its holder may take it again
    assert 0 < redis.ttl(reservation_key("GPU-a")) <= 10  # a dead holder's reservation expires
    assert keep_devices(redis, ["GPU-a", "GPU-b", "GPU-c"], "gpu0@box") == 2
    release_devices(redis, ["GPU-a", "GPU-b"], "gpu2@box")
    assert device_holders(redis, ["GPU-a", "GPU-b"]) == {"GPU-a": "gpu0@box", "GPU-b": "gpu0@box"}
    release_devices(redis, ["GPU-a", "GPU-b"], "gpu0@box")
    assert device_holders(redis, ["GPU-a", "GPU-b"]) == {}

    with pytest.raises(RuntimeError):
        with DeviceLease(redis, "gpu0@box") as lease:
            assert lease.take(["GPU-a"]) and lease.take(["GPU-b"])
            assert not DeviceLease(redis, "gpu1@box").take(["GPU-b"])
            raise RuntimeError("the job's runner failed")
    assert device_holders(redis, ["GPU-a", "GPU-b"]) == {}


def test_a_worker_borrows_an_idle_device_unless_another_worker_took_it_first(studio, monkeypatch):
    redis = studio.redis
    own, other = cpu_device("cpu0@test"), cpu_device("cpu1@test")
    announce_worker(redis, "cpu1@test", other.with_free_memory(8 * GIB))
    announce_worker(redis, "cpu9@elsewhere", cpu_device("cpu9@elsewhere").model_copy(update={"host": "elsewhere"}))
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(4)), gpus=2)
    sessions = _sessions(studio)

    def then_cpu1_takes_its_device(redis_, device):
        """cpu1's worker reserves its own device (to run a job) just after cpu0 saw it idle."""
        found = idle_devices(redis_, device)
        assert reserve_devices(redis, [other.id], "cpu1@test")
        return found

    monkeypatch.setattr(runner, "idle_devices", then_cpu1_takes_its_device)
    passed_over: set[int] = set()
    with DeviceLease(redis, "cpu0@test") as lease:
        assert lease.take([own.id])
        assert _claim(sessions, redis, "cpu0@test", own, lease, passed_over) == (None, None)
        assert lease.device_ids == [own.id]
    assert passed_over == {job_id}
    monkeypatch.undo()
    job = studio.get_job(job_id)
    assert (job.status, job.worker, job.started_at) == (JobStatus.queued, None, None)
    release_devices(redis, [other.id], "cpu1@test")

    with DeviceLease(redis, "cpu0@test") as lease:
        assert lease.take([own.id])
        job, placement = _claim(sessions, redis, "cpu0@test", own, lease, set())
        assert job.id == job_id and lease.device_ids == [own.id, other.id]  # not the other host's
        assert [d.id for d in placement.devices] == [own.id, other.id] and placement.strategy == "ddp"
        assert device_holders(redis, [other.id]) == {other.id: "cpu0@test"}
        assert {r.name: r.reserved_by for r in live_workers(redis)}["cpu1@test"] == "cpu0@test"
        assert studio.get_job(job_id).device == placement.record()
    assert device_holders(redis, [own.id, other.id]) == {}


def _sessions(studio):
    from lanner.core.db import session_factory

    return session_factory(studio.database_url)


def test_cpu_workers_standing_in_for_gpus_run_jobs_side_by_side_and_all_show(studio, celery_worker, monkeypatch):
    too_big = studio.job(studio.dataset("big.jsonl", qa_rows(8)), FAST, name="too big", priority=9,
                         memory_estimate_bytes=2 ** 50)
    first = studio.job(studio.dataset("a.jsonl", qa_rows(8)), FAST, name="first")
    second = studio.job(studio.dataset("b.jsonl", qa_rows(8)), FAST, name="second")
    workers = [celery_worker("cpu0"), celery_worker("cpu1")]

    jobs = [studio.wait_for(job_id, lambda j: j.status in (JobStatus.succeeded, JobStatus.failed), 300, "the end")
            for job_id in (first, second)]
    assert [job.status for job in jobs] == [JobStatus.succeeded] * 2, [job.error for job in jobs]
    assert {job.worker for job in jobs} == {worker.hostname for worker in workers}
    assert {job.device["id"] for job in jobs} == {f"cpu:{worker.hostname}" for worker in workers}
    a, b = jobs
    assert a.started_at < b.finished_at and b.started_at < a.finished_at  # side by side, not one after the other
    assert studio.get_job(too_big).status == JobStatus.queued  # fits no device's free memory

    queue = [(kind, data["job_id"], data["status"]) for kind, data in queue_events(studio, (first, second))]
    for job_id in (first, second):
        assert [entry for entry in queue if entry[1] == job_id] == [("started", job_id, "running"),
                                                                    ("finished", job_id, "succeeded")]

    samples = read_after(studio.redis, HARDWARE_STREAM, count=10_000)
    assert {data["worker"] for _, kind, data in samples if kind == "device"} == {w.hostname for w in workers}
    assert all(data["memory_total_bytes"] > 0 and "cpu_percent" in data for _, _, data in samples)

    monkeypatch.setenv("LANNER_DATA_DIR", str(studio.data_dir))
    monkeypatch.setenv("LANNER_DATABASE_URL", studio.database_url)
    monkeypatch.setenv("LANNER_REDIS_URL", WORKER_REDIS_URL)
    get_settings.cache_clear()
    from lanner.backend.app import create_app

    from redis import Redis

    from lanner.backend.security import SESSION_COOKIE, open_session

    signed_in = {SESSION_COOKIE: open_session(Redis.from_url(WORKER_REDIS_URL), studio.owner_id, days=1)}
    try:  # the workers' hosts and devices are shown to a signed-in user only
        health = TestClient(create_app(), cookies=signed_in).get("/api/health").json()
    finally:
        get_settings.cache_clear()
    devices = {worker["name"]: worker["device"] for worker in health["workers"]}
    assert set(devices) == {worker.hostname for worker in workers}
    assert {device["id"] for device in devices.values()} == {f"cpu:{worker.hostname}" for worker in workers}
    assert all(0 < device["memory_free_bytes"] <= device["memory_total_bytes"] for device in devices.values())
    assert all(device["host"] == socket.gethostname() for device in devices.values())
