"""
Waiting for masters to settle: a runner run right after ``multimaster.master`` meets masters
restarting (the state restarts a master once the job that changed its config has returned), and
rides that out with progress instead of failing on the first master that does not answer.
"""

import time

import multimaster_control
from salt.exceptions import SaltClientError

# master_settled answers in well under a second; a control minion that is restarting does not
# answer at all, and each poll that meets one waits this long (plus Salt's find_job round).
SETTLED_POLL_TIMEOUT = 3
# How long a runner waits for a pending restart before it refuses.
SETTLE_TIMEOUT = 120
# A control minion that does not answer may be restarting, or its host may be down: wait this
# long for it, then go on (the run then reports that master unreachable).
SILENT_GRACE = 15


def poll_settled(run, found, masters):
    """
    ``(answers, errors)`` of ``master_settled`` on ``masters``; while this master itself is
    restarting nothing can be published and every master is an error.
    """
    try:
        return multimaster_control.call(
            run, found, masters, "master_settled", {}, SETTLED_POLL_TIMEOUT
        )
    except SaltClientError:
        return {}, {m: "this master is restarting: nothing can be published yet" for m in masters}


def await_restarts(run, found):
    """
    Wait, with progress, while a master's restart is pending or this master is restarting;
    masters that are down are left for the run to report. Raises ``Refused`` naming the
    masters still restarting after ``SETTLE_TIMEOUT`` seconds.
    """
    start = time.monotonic()
    waiting = multimaster_control.ids(found)
    while True:
        answers, errors = poll_settled(run, found, waiting)
        waited = time.monotonic() - start
        pending = [m for m, a in answers.items() if (a or {}).get("restart_pending")]
        silent = [m for m in waiting if m not in answers and waited < SILENT_GRACE]
        waiting = pending + silent
        if not waiting:
            return
        if waited > SETTLE_TIMEOUT:
            raise multimaster_control.Refused(
                f"a restart of {', '.join(waiting)} is still pending after {SETTLE_TIMEOUT}s "
                f"({'; '.join(str(errors.get(m) or answers.get(m)) for m in waiting)}): "
                "run 'salt-run multimaster.wait_masters', then run this command again"
            )
        run.progress(f"waiting for {', '.join(waiting)} to finish restarting ({round(waited)}s)")
        time.sleep(1)
