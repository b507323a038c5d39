"""One attempt of a queued job, in one process on the job's own node: its attempt controller.

The service starts one per admission (`orchestrator.service.runner`): a detached actor named
`<job id>-a<attempt>`, on the node with most of the job's workers, in the job's package (its
project directory and stored spec, as Ray's working_dir). The one process holds the whole
attempt:

    the run's state      the workers' calls: records, checkpoints, restarts, the stop flag
                         (`run_state.RunState`, which it is)
    the run              Ray Train's `fit()` and its controller loop, on a thread of its own
                         (`launcher.run_controller_here`): the workers and their placement group
                         belong to this process
    the attempt          on another thread (`driver.run_for_service`): attached to the
                         service's record, records to the metrics log, progress to the service,
                         its stop, preempt or abort carried to the workers, the summary reported

where a Ray Job's supervisor, its driver and the run's state actor were three processes. When
the attempt is reported the process ends; a run aborted before that (a stop before the first
step, or a job the service requeued) ends with it, workers and all.
"""

from __future__ import annotations

import sys
import time
import traceback

import ray

from orchestrator.ray.run_state import RUN_STATE_OPTIONS, RunState

KILL_WAIT_S = 30.0  # ray.kill of this process takes milliseconds


class AttemptController(RunState):
    @ray.method(concurrency_group="attempt")
    def run(self, job_id: str, spec_path: str) -> int:
        """Run the attempt the service admitted `job_id` for; the spec is the one stored in the
        job's package at `spec_path` (relative to the working_dir this process runs in)."""
        from core.spec import load_stored
        from orchestrator import driver

        code = 1
        sys.stderr = sys.stdout  # one log, in order: `orchestrator logs` reads the process's stdout
        try:
            me = ray.get_runtime_context().current_actor
            code = driver.run_for_service(load_stored(spec_path), job_id, me)
        except BaseException:  # the service sees the process end; the reason goes to its log
            traceback.print_exc()
        finally:
            self._end()
        return code

    def _end(self) -> None:
        """End this process, and with it an aborted run's controller loop and workers."""
        sys.stdout.flush()
        sys.stderr.flush()
        if self.fitting:
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
            time.sleep(KILL_WAIT_S)
        ray.actor.exit_actor()


AttemptControllerActor = ray.remote(**RUN_STATE_OPTIONS, concurrency_groups={"fit": 1, "attempt": 1})(
    AttemptController
)
