"""JupyterHub for one dpmp_lab course on one server (docs/instructor-guide.md: "Running a class
on a GPU server").

    DPMP_LAB_HUB_COURSE=/home/teacher/dpmp_course DPMP_LAB_HUB_INSTRUCTORS=teacher \
    DPMP_LAB_HUB_LEARNERS="ada bob" python3 bootstrap.py hub

Every setting is a DPMP_LAB_HUB_* variable, read and checked by dpmp_lab/instructor/hub.py;
jupyterhub's own options (--port, --ip, ...) go on the command line.
"""

from pathlib import Path

from dpmp_lab.instructor.hub import HubSettings, configure

c = get_config()  # noqa: F821 (provided by jupyterhub when it reads this file)
here = Path(__file__).resolve().parent
configure(c, HubSettings.from_env(),
          proxy=here / "node_modules" / ".bin" / "configurable-http-proxy", checkout=here.parent)
