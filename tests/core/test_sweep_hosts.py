"""Every host's workers sweep for the jobs of lost workers, at the same time too: each job goes back
to the queue once (row locks on PostgreSQL, a conditional UPDATE elsewhere)."""
from __future__ import annotations

import threading
import time

from sqlalchemy import select

from lanner.core.models import Job, JobStatus
from lanner.core.queue.claim import sweep_orphaned_jobs

from job_specs import stored_spec
from queue_helpers import add_job, make_db

SWEEPERS = 4


def test_hosts_sweeping_at_once_requeue_each_lost_job_once(database_url):
    factory, owner = make_db(database_url)
    with factory() as session:
        lost = [add_job(session, owner, f"lost {i}", status=JobStatus.running, worker="gpu0@host-a",
                        worker_instance="a1", host="host-a", config=stored_spec()) for i in range(6)]
        alive = add_job(session, owner, "alive", status=JobStatus.running, worker="gpu0@host-b",
                        worker_instance="b1", host="host-b", config=stored_spec())
    start = threading.Barrier(SWEEPERS)
    swept: list[list[int]] = []
    errors: list[BaseException] = []

    def slow_resume_point(job):  # a sweep that takes a while: the others run meanwhile
        time.sleep(0.05)
        return f"checkpoint-{job.id}"

    def sweep(host: str):
        try:
            with factory() as session:
                start.wait()
                swept.append(sweep_orphaned_jobs(session, {"gpu0@host-b", f"cpu0@{host}"},
                                                 resume_point=slow_resume_point))
        except BaseException as error:  # reported below, with the assertion
            errors.append(error)

    threads = [threading.Thread(target=sweep, args=(f"host-{n}",)) for n in range(SWEEPERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    everything = sorted(job_id for ids in swept for job_id in ids)
    assert everything == lost, swept  # each lost job swept by exactly one host
    with factory() as session:
        jobs = {job.id: job for job in session.execute(select(Job)).scalars()}
    assert all((jobs[job_id].status, jobs[job_id].requeues, jobs[job_id].resume_from, jobs[job_id].worker,
                jobs[job_id].worker_instance) == (JobStatus.queued, 1, f"checkpoint-{job_id}", None, None)
               for job_id in lost), {job_id: (jobs[job_id].status, jobs[job_id].requeues) for job_id in lost}
    assert (jobs[alive].status, jobs[alive].worker) == (JobStatus.running, "gpu0@host-b")


def test_a_sweep_leaves_a_job_claimed_again_since_it_read_it(database_url):
    """A sweeper that read a job as lost before another host requeued it and a worker claimed it
    (same worker name, another process of it) leaves it running."""
    factory, owner = make_db(database_url)
    with factory() as session:
        job_id = add_job(session, owner, "reclaimed", status=JobStatus.running, worker="gpu0@host-a",
                         worker_instance="old", config=stored_spec())

    def reclaimed_meanwhile(job):
        with factory() as other:
            other.get(Job, job_id).worker_instance = "new"  # requeued and claimed again, in one step here
            other.commit()
        return None

    with factory() as session:
        read = session.execute(select(Job).where(Job.id == job_id)).scalar_one()
        reclaimed_meanwhile(read)
        from lanner.core.queue.claim import _take_running

        assert not _take_running(session, read)
        session.rollback()
    with factory() as session:
        assert sweep_orphaned_jobs(session, set()) == [job_id]  # read afresh, it is lost again: swept
