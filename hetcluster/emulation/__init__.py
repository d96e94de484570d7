"""The embedded default fleet: emulated devices that are real agent processes on this machine.

``catalog`` says what each device is; ``cgroups`` (v1 or v2, detected) or ``dutycycle``
(SIGSTOP/SIGCONT, the fallback) make it genuinely slower; ``netns`` optionally puts it behind a
shaped veth in its own network namespace; ``cluster`` starts, inspects and stops the whole fleet
and records what it made so that `hetcluster cluster down` removes exactly that.
"""
