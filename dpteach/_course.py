"""Facts about the course that the notebooks, the README and the tests must agree on."""

REPOSITORY = "https://github.com/dpteach/dpteach"
RELEASE = "v0.1.0"

# The first code cell of every chapter, verbatim (tests/test_notebooks.py checks it).
SETUP_CELL = f'''\
# Set-up: on Colab, install dpteach from the course repository and turn on widgets;
# anywhere else (JupyterLab, Binder, a laptop) this cell does nothing.
import sys, subprocess
if "google.colab" in sys.modules:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "dpteach @ git+{REPOSITORY}@{RELEASE}"], check=True)
    from google.colab import output
    output.enable_custom_widget_manager()'''
