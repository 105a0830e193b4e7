"""The scheduler: admission, the plan of each step, and what a step's result means for each request.

It keeps books only; it never touches a tensor or a model. ``schedule()``:
  1. take in new requests and cancellations (thread-safe inbox: a server thread feeds it; intake.py);
  2. admit waiting requests while the batch has room and the runner's KV has their first step
     (admission.py);
  3. plan prompt prefill under the per-step token budget (long prompts go in chunks, k = 0);
  4. give every ready sequence its k for this step (0 when the adaptive controller chose plain);
  5. fit the step into the KV pool: KV is taken as sequences grow, and when the pool would run
     out the most recently admitted sequence is preempted (freed, queued first, recomputed).
``postprocess(plan, result)``: record what the runner now holds, emit verified tokens and the text
safe to show, finish requests on end id / stop string / max_tokens / error (outputs.py), free them,
keep stats. The draft-verify-accept work in between is the runner's (runners/, behind ``SpecRunner``).
"""

from trispec.scheduler.outputs import RequestOutput
from trispec.scheduler.scheduler import Scheduler

__all__ = ["RequestOutput", "Scheduler"]
