"""ParallelDims: the one object that owns every device mesh of a training engine.

The world is laid out as a 3-axis mesh ("dp", "cp", "tp"), tp fastest: ranks that share a
model replica's tensor-parallel shards are neighbours. "axis" names a mesh axis; "dim" is a
tensor dimension. FSDP shards over the flattened ("dp", "cp") axes, because context-parallel
ranks hold the same parameters and their gradients must be summed like data-parallel ones.
"""

from dataclasses import dataclass, field

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

AXES = ("dp", "cp", "tp")


@dataclass
class ParallelDims:
    """Sizes of the data-, context- and tensor-parallel axes over `world_size` ranks.

    Args:
        world_size: ranks in the engine.
        tp: tensor-parallel size.
        cp: context-parallel size.
        device_type: "cpu" or "cuda".
    """

    world_size: int
    tp: int = 1
    cp: int = 1
    device_type: str = "cpu"
    _mesh: DeviceMesh | None = field(default=None, init=False, repr=False)
    _submeshes: dict[str, DeviceMesh] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if min(self.world_size, self.tp, self.cp) < 1:
            raise ValueError(f"parallel sizes must be >= 1, got {self}")
        if self.world_size % (self.tp * self.cp):
            raise ValueError(
                f"tensor-parallel ({self.tp}) x context-parallel ({self.cp}) = "
                f"{self.tp * self.cp} must divide the world size ({self.world_size})"
            )

    @property
    def dp(self) -> int:
        """Data-parallel size: world / (tp x cp)."""
        return self.world_size // (self.tp * self.cp)

    def coordinates(self, rank: int) -> dict[str, int]:
        """{"dp": i, "cp": j, "tp": k} of a global rank (without building a mesh)."""
        return {
            "dp": rank // (self.cp * self.tp),
            "cp": rank // self.tp % self.cp,
            "tp": rank % self.tp,
        }

    def build_mesh(self) -> DeviceMesh:
        """Build the ("dp", "cp", "tp") mesh and its flattened "dp_cp" axis (a collective call:
        every rank must call it, after torch.distributed is initialized)."""
        mesh = init_device_mesh(self.device_type, (self.dp, self.cp, self.tp), mesh_dim_names=AXES)
        # Sliced once here: slicing builds a new DeviceMesh each time (a measurable share of a
        # tiny model's step when every forward asks for its tp rank).
        self._submeshes = {axis: mesh[axis] for axis in AXES}
        self._submeshes["dp_cp"] = mesh["dp", "cp"]._flatten("dp_cp")
        self._mesh = mesh
        return mesh

    @property
    def mesh(self) -> DeviceMesh:
        """The world mesh (build_mesh first)."""
        if self._mesh is None:
            raise RuntimeError("ParallelDims.build_mesh() has not been called")
        return self._mesh

    def submesh(self, axis: str) -> DeviceMesh:
        """The 1-axis mesh of "dp", "cp", "tp" or the flattened "dp_cp"."""
        if not self._submeshes:
            raise RuntimeError("ParallelDims.build_mesh() has not been called")
        return self._submeshes[axis]

    def group(self, axis: str) -> dist.ProcessGroup:
        """The process group of this rank along `axis`."""
        return self.submesh(axis).get_group()

    def local_rank(self, axis: str) -> int:
        """This rank's coordinate along `axis`."""
        return self.submesh(axis).get_local_rank()
