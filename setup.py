"""Packaging beyond pyproject.toml: ship `specrl_openrlhf_hook.pth` at the root of site-packages (normal and
editable installs), so that `python -m openrlhf.cli.train_ppo_ray` accepts our flags (see _specrl_openrlhf_hook.py)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HOOK_PTH = "specrl_openrlhf_hook.pth"


class BuildPyWithHook(build_py):
    def run(self):
        super().run()
        # A normal wheel installs build_lib's root into site-packages; an editable wheel is packed from install_lib.
        root = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        Path(root).mkdir(parents=True, exist_ok=True)
        self.copy_file(str(Path(__file__).with_name(HOOK_PTH)), str(Path(root, HOOK_PTH)))

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib, HOOK_PTH))]


setup(cmdclass={"build_py": BuildPyWithHook})
