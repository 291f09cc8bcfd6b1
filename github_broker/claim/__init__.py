"""The claim: what an agent is handed and on what terms.

`service.py` (the agents' use cases: request a task, heartbeat, complete, release), `walk.py`
(which repositories one request claims in, in which order, under the agent's mutex; `judge`
for `explain`), `share.py` (repositories tied in that order take turns by weight),
`handout.py` (the task an agent receives: fields, prompt, lease grant), `rules.py` (what an
issue is: priority, role, assignable body, branch, holder), `prompts.py` (the prompt
templates), `repo_index.py` (this process's copy of the repositories with work), `events.py`
(long-polls woken when any process makes a task claimable). The claim itself is
`lua/claim.lua`, run through `store/`.
"""
