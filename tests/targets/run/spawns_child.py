"""A parent that runs another Python program (eager_flex.py) as a child process."""

import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
child = subprocess.run([sys.executable, os.path.join(here, "eager_flex.py")], check=True)
print("child exited", child.returncode)
