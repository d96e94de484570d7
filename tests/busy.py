"""A busy process for the emulation tests that does not outlive the test that started it."""

# Burns a core until its parent is gone: if pytest is killed mid-test (no finally runs), the loop
# is re-parented and exits instead of eating a core until the machine reboots.
BUSY_UNTIL_ORPHANED = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass\n"
