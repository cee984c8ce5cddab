"""What every job driver needs around Ray, apart from any one job.

    cluster.py            which Ray cluster a job runs on (joined, or a private one it starts),
                          and whether that cluster can hold the run
    local_cluster.py      a real multi-node Ray cluster on one machine (drills, tests)
    lean_train.py         Ray Train's TorchTrainer without the services our jobs do not use
    lease.py              one live run per run directory: a lease file with a heartbeat
    fit.py                ask for no more GPU workers than the cluster has
    progress.py           the driver's one progress line, followed from metrics.jsonl
    startup.py            the command's start, and start-up figures measured from it
    recovery_callback.py  Ray Train controller decisions (retries, resizes) into events.jsonl
    stop.py               Ctrl-C / SIGTERM: one line, a clean end, the command that resumes
"""
