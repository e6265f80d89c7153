"""The strategies a rollout runs (docs/rollouts.md). Each is a class with:

  run()          the rollout from where the state says it is (a fresh start, or a resume after a restart)
  abort_now()    at once, synchronously: the candidate takes no more user requests
  roll_back()    then: its replicas drain and stop, the stable is as before (blue-green after the switch:
                 traffic back to the old revision)
  can_abort()    whether an abort still makes sense; aborted_phase: the phase an abort ends in
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from argosy.fleet.rollout.manager import RolloutManager


def strategy_for(mgr: RolloutManager):
    from argosy.fleet.rollout.blue_green import BlueGreen
    from argosy.fleet.rollout.canary import Canary
    from argosy.fleet.rollout.rolling import Rolling

    return {"canary": Canary, "blue-green": BlueGreen, "rolling": Rolling}[mgr.rollout.strategy](mgr)
