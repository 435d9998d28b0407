# copied from sgl-project/SpecForge@a6b6b0230009d15ec2a97a57384e6f53f0f96946: specforge/__init__.py
"""SpecForge package.

Training is configured through :mod:`specforge.cli`; implementation types live
in their owning subpackages and are not re-exported through a compatibility API.
"""
