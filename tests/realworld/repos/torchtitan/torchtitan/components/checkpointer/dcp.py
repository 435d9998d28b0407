# copied from pytorch/torchtitan@b5bcd76c66d0acb1a08b176d9639425bc55e0b2a: torchtitan/components/checkpointer/dcp.py
# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

from __future__ import annotations

import enum
import os
import queue
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, cast, Literal, TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageWriter
from torch.distributed.checkpoint._consolidate_hf_safetensors import (
    consolidate_safetensors_files_on_every_rank,
)
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import (
    AsyncCheckpointerType,
    AsyncSaveResponse,
)
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.observability import structured_logger as sl
from torchtitan.tools import filesystem
from torchtitan.tools.logging import logger
from torchtitan.tools.utils import GarbageCollection

from .base import (
    BaseCheckpointManager,
    DATALOADER,
    LR_SCHEDULER,
    MODEL,
    ModelWrapper,
    OPTIMIZER,
    purge_thread,
)

if TYPE_CHECKING:
    import torch.nn as nn

    from torchtitan.components.data.loader import BaseDataLoader
    from torchtitan.components.optimizer import (
        LRSchedulersContainer,
        OptimizersContainer,
    )
    from torchtitan.protocols.state_dict_adapter import BaseStateDictAdapter


class AsyncMode(str, enum.Enum):
    DISABLED = "disabled"
    ASYNC = "async"
    ASYNC_WITH_PINNED_MEM = "async_with_pinned_mem"


class SaveDone:
    pass


class _FilesystemCheckpointStorage:
    """``CheckpointStorage`` backed by ``torchtitan.tools.filesystem``.

    Local paths go through ``os``/``shutil`` and remote fsspec URIs through
    fsspec, so DCP keeps reading and writing remote checkpoint folders exactly
    as it did before.
    """

    def isdir(self, path: str) -> bool:
        return filesystem.isdir(path)

    def isfile(self, path: str) -> bool:
        return filesystem.isfile(path)

    def listdir(self, path: str) -> list[str]:
        return filesystem.listdir(path)

    def remove(self, path: str) -> None:
        filesystem.rmtree(path)


class CheckpointManager(BaseCheckpointManager):
    """This class manages the checkpointing logic for the TorchTitan trainer.


    Note: Pipeline Parallelism and Virtual Stages

    1. even for simple PP schedules, there is a separate optimizer each PP rank.
    rank0's optimizer would have a param_group[0] which refers to layers.0 in the
    original model. rank1's would _also_ have a param_group[0], since it's index based,
    but referring to layers.1. When saving, these collide and one of them is lost.
    Then when reloading, only one stage can restore its optimizer states, others will
    error.

        The solution to this problem is optimizer flattening.
        TorchTitan's OptimizersContainer flattens optimizer state dicts to FQN-keyed
        flat dicts using the utilities in torchtitan/components/optimizer/utils.py.

    2. With complex PP schedules, we have multiple model chunks per pp rank. This
    compounds challenge (1) by also requiring us to reason about multiple 'optim'
    objects locally.

        We solve this in the Model and Optimizer wrapper classes by flattening the state
        dicts from each object into one state dict before saving/loading. We rely on the
        individual state_dicts to not collide, which is guaranteed for the model by
        correct pipeline splitting and for the optimizer by the flattening support
        described in (1).

    3. LR schedulers also index model states like optimizers. Here we flatten the
    lr_schedulers with the assumption that all lr_schedulers have the same state_dict.

    Args:
        config (Checkpoint): The config used to configure the checkpointing.
        dataloader (BaseDataLoader): The dataloader used to load the data.
        model_parts (List[nn.Module]): List of model parts to be optimized.
        optimizers (OptimizersContainer): The optimizers used to optimize the model.
        lr_schedulers (LRSchedulersContainer): The lr schedulers used to optimize
            the model.
        states (Dict[str, Any]): The states that need to be saved, other than the
            previous 4 components.
        sd_adapter (Optional[type[BaseStateDictAdapter]]): The adapter used to convert
            model state dicts between native format and other formats.
        base_folder (str): The base folder to save the checkpoint. Will be concatenated
            with config.folder

    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseCheckpointManager.Config):
        async_mode: Literal["disabled", "async", "async_with_pinned_mem"] = "disabled"
        """DCP save mode: synchronous, threaded async, or pinned-memory async."""

        def __post_init__(self) -> None:
            BaseCheckpointManager.Config.__post_init__(self)
            async_lowered = self.async_mode.lower()
            if async_lowered not in (
                "disabled",
                "async",
                "async_with_pinned_mem",
            ):
                raise ValueError(f"Invalid async_mode: {async_lowered}")
            self.async_mode = async_lowered

    def __init__(
        self,
        config: Config,
        *,
        dataloader: BaseDataLoader | None,
        model_parts: list[nn.Module],
        optimizers: OptimizersContainer,
        lr_schedulers: LRSchedulersContainer,
        states: dict[str, Any],
        sd_adapter: BaseStateDictAdapter | None,
        base_folder: str = "",
    ) -> None:

        self.enable = config.enable
        if not self.enable:
            return

        self.folder = filesystem.join(base_folder, config.folder)
        self.interval = config.interval
        self._storage = _FilesystemCheckpointStorage()

        self.states = states
        self.states.update(
            {
                MODEL: ModelWrapper(model_parts),
                OPTIMIZER: optimizers,
                DATALOADER: dataloader,
                LR_SCHEDULER: lr_schedulers,
            }
        )

        # Loading & Saving Policy
        self.load_only = config.load_only
        self.exclude_from_loading = config.exclude_from_loading
        self.initial_load_path = config.initial_load_path
        self.initial_load_model_only = config.initial_load_model_only
        self.initial_load_in_hf = config.initial_load_in_hf
        self.initial_load_in_hf_quantized = config.initial_load_in_hf_quantized

        self.enable_first_step_checkpoint = config.enable_first_step_checkpoint
        self.last_save_model_only = config.last_save_model_only
        self.last_save_in_hf = config.last_save_in_hf
        self.export_dtype = TORCH_DTYPE_MAP[config.export_dtype]

        self.sd_adapter = sd_adapter
        if self.last_save_in_hf and self.sd_adapter is None:
            raise ValueError(
                "checkpoint.last_save_in_hf is True, but sd_adapter is not provided."
            )

        # Async & Distributed Infrastructure
        try:
            self.async_mode = AsyncMode(config.async_mode)
        except ValueError as e:
            raise ValueError(
                f"Unknown checkpoint async_mode {config.async_mode}"
            ) from e

        self.pg: dist.ProcessGroup | None = None
        if self.async_mode in (AsyncMode.ASYNC, AsyncMode.ASYNC_WITH_PINNED_MEM):
            self.pg = cast(dist.ProcessGroup, dist.new_group(backend="gloo"))

        self.stager: DefaultStager | None = None
        self.staging_future: Future | None = None
        self.save_future: Future | None = None

        # Retention Policy (Purge)
        self.keep_latest_k = config.keep_latest_k
        self.purge_thread: threading.Thread | None = None
        if self.keep_latest_k > 0:
            self.purge_queue: queue.Queue[str | None] = queue.Queue()
            self.purge_thread = threading.Thread(
                target=purge_thread,
                args=(self.purge_queue, self._storage.remove),
                daemon=True,
            )
            self.purge_thread.start()

        logger.info(
            "Checkpointing active. Checkpoints will be loaded from and saved "
            f"to {self.folder}"
        )

    def __del__(self):
        self.close()

    def _close(self):
        if (
            hasattr(self, "purge_thread")
            and self.purge_thread
            and self.purge_thread.is_alive()
        ):
            self.purge_queue.put(None)
            self.purge_thread.join()

        if self.stager is not None:
            self.stager.close()

    @torch.no_grad()
    def dcp_save(
        self,
        state_dict: dict[str, Any],
        checkpoint_id: str,
        async_mode: AsyncMode,
        enable_garbage_collection: bool = False,
        to_hf: bool = False,
    ) -> Future | AsyncSaveResponse | None:
        """Execute the DCP saving process.

        This method orchestrates the state_dict transformation (e.g., to HuggingFace
        format), selects the appropriate storage writer, and dispatches the save
        operation based on the requested synchronicity mode.

        Args:
            state_dict (dict): The state dict to save.
            checkpoint_id (str): Unique identifier (usually a path) for the checkpoint.
            async_mode (AsyncMode): The saving/staging strategy.
            enable_garbage_collection (bool): To trigger a manual GC collect after save.
            to_hf (bool): If True, uses a HuggingFaceStorageWriter and adapts the
                state_dict to be compatible with safetensors and HF model definitions.

        Returns:
            - None: If saved synchronously (AsyncMode.DISABLED).
            - Future: If AsyncMode.ASYNC is used (tracks disk I/O).
            - AsyncSaveResponse: If AsyncMode.ASYNC_WITH_PINNED_MEM is used
              (tracks both staging and disk I/O).
        """

        ret: Future | AsyncSaveResponse | None = None

        storage_writer: HuggingFaceStorageWriter | None = None
        fqn_to_index_mapping: dict[Any, int] | None = None

        # HF Format Conversion
        if to_hf:
            assert self.sd_adapter is not None, "sd_adapter is required for to_hf=True"
            state_dict = self.sd_adapter.to_hf(state_dict)
            fqn_to_index_mapping = self.sd_adapter.fqn_to_index_mapping

            # If sharded, we save to a subdir then consolidate
            save_path = (
                os.path.join(checkpoint_id, "sharded")
                if fqn_to_index_mapping
                else checkpoint_id
            )
            storage_writer = HuggingFaceStorageWriter(
                path=save_path,
                save_distributed=True,
                fqn_to_index_mapping=fqn_to_index_mapping,
                enable_consolidation=not fqn_to_index_mapping,
            )
            # NOTE: If `fqn_to_index_mapping` is absent, all FQNs are saved into a
            # single unified file. In this case, the StorageWriter can handle
            # consolidation internally on a single rank. However, when a mapping
            # exists, the weights are distributed across multiple files (sharded).
            # The internal consolidation is disabled here and instead
            # `consolidate_safetensors_files_on_every_rank` is used later to manage
            # the multi-file merging process.

        # Execution Dispatch
        checkpoint_save_id = (
            None if to_hf else checkpoint_id
        )  # for HF the storage_writer handles the path

        if async_mode == AsyncMode.ASYNC:
            ret = dcp.async_save(
                state_dict,
                storage_writer=storage_writer,
                checkpoint_id=checkpoint_save_id,
                process_group=self.pg,
            )
        elif async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM:
            ret = dcp.async_save(
                state_dict,
                storage_writer=storage_writer,
                checkpoint_id=checkpoint_save_id,
                process_group=self.pg,
                async_checkpointer_type=AsyncCheckpointerType.PROCESS,
                async_stager=self.stager,
            )
        else:
            ret = dcp.save(
                state_dict,
                storage_writer=storage_writer,
                checkpoint_id=checkpoint_save_id,
            )

        # Post-Processing
        if to_hf and fqn_to_index_mapping:
            consolidate_safetensors_files_on_every_rank(
                input_dir=os.path.join(checkpoint_id, "sharded"),
                output_dir=checkpoint_id,
                fqn_to_index_mapping=fqn_to_index_mapping,
                num_threads=5,
            )

        if enable_garbage_collection:
            GarbageCollection.collect("GC collection invoked by checkpointer.")

        return ret

    def dcp_load(
        self,
        state_dict: dict[str, Any],
        checkpoint_id: str,
        from_hf: bool,
        from_quantized: bool,
    ) -> None:
        """Load a DCP into the provided state dictionary.

        This method handles both standard DCP sharded checkpoints and HuggingFace
        safetensors. If loading from HF, it utilizes an adapter to map FQNs and
        handle format-specific sharding logic.

        Args:
            state_dict (dict): The target dictionary to populate with checkpoint data.
            checkpoint_id (str): Path or identifier for the source checkpoint.
            from_hf (bool): If True, adapts the load process for HuggingFace model
                definitions and safetensors format.
            from_quantized (bool): Indicates if the source is in a quantized format
                (e.g., 4-bit/8-bit), requiring the storage reader to handle
                specialized data types and sharding structures.

        Raises:
            AssertionError: If `from_hf` is True but no `sd_adapter` is available.
        """

        if from_hf:
            assert self.sd_adapter is not None, (
                "trying to load checkpoint in HF safetensors format, "
                "but sd_adapter is not provided."
            )

            hf_state_dict = self.sd_adapter.to_hf(state_dict)
            hf_storage_reader = self.sd_adapter.get_hf_storage_reader(
                checkpoint_id, from_quantized
            )

            dcp.load(hf_state_dict, storage_reader=hf_storage_reader)

            state_dict = self.sd_adapter.from_hf(hf_state_dict)
            self.states[MODEL].load_state_dict(state_dict)
        else:
            dcp.load(state_dict, checkpoint_id=checkpoint_id)

            # TODO: Since we flatten the model states in state_dict, we need to
            # manually call load_state_dict() for the model. Need to fix this.
            if MODEL in self.states:
                self.states[MODEL].load_state_dict(state_dict)

    @sl.log_trace_span("checkpoint_save")
    @torch.no_grad()
    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        """Save the checkpoint for the current step.

        This function manages the checkpointing lifecycle for the current step.
        A save is performed if any of the following conditions are met:
        1. It is the initial seed checkpoint (step 0).
        2. The current step matches the configured saving interval.
        3. `last_step` is True, which forces a save regardless of the interval.
           This typically happens when the training reaches its final step.

        Args:
            curr_step (int): The current training step.
            last_step (bool, optional): Whether this is the final step of training.

        Returns:
            bool: True if a checkpoint was written (or staged, for async modes) on
            this step.
        """

        if not self._should_save(curr_step, last_step):
            return False

        sl.add_step_tag("checkpoint_save")

        self.maybe_wait_for_saving()

        begin = time.monotonic()
        checkpoint_phase = (
            "saving" if self.async_mode == AsyncMode.DISABLED else "staging"
        )
        logger.info(f"{checkpoint_phase.capitalize()} the checkpoint.")

        if last_step:
            self._save_last_step(curr_step)
            logger.info(
                f"Last step checkpoint completed in {time.monotonic() - begin:.2f}s"
            )
            return True

        checkpoint_id = self._create_checkpoint_id(curr_step)
        states = self._flattened_model_states_sd()

        if self.async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
            if self.stager is None:
                self.stager = DefaultStager(
                    StagingOptions(
                        use_pinned_memory=True,
                        use_shared_memory=True,
                        use_async_staging=True,
                        use_non_blocking_copy=True,
                    )
                )

            result = self.dcp_save(
                states,
                checkpoint_id=checkpoint_id,
                async_mode=self.async_mode,
            )
            # Calling GC here is not required for this path.

            assert isinstance(result, AsyncSaveResponse)
            self.staging_future = result.staging_completion
            self.save_future = result.upload_completion

        elif self.async_mode == AsyncMode.ASYNC:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
            result = self.dcp_save(
                states,
                checkpoint_id=checkpoint_id,
                async_mode=self.async_mode,
            )
            GarbageCollection.collect("GC collection invoked by checkpointer.")

            assert isinstance(result, Future)
            self.save_future = result

        else:
            self.dcp_save(
                states,
                checkpoint_id=checkpoint_id,
                async_mode=AsyncMode.DISABLED,
                enable_garbage_collection=True,
            )

        self._purge_stale_checkpoints()

        logger.info(
            f"Finished {checkpoint_phase} the checkpoint in "
            f"{time.monotonic() - begin:.2f} seconds."
        )
        return True

    @sl.log_trace_span("checkpoint_load")
    @torch.no_grad()
    def _load(self, step: int = -1) -> bool:
        """Load the checkpoint for the given step.

        This function orchestrates the states loading process.
        If the local checkpoint folder contains a valid checkpoint, it retrieves the
        checkpoint corresponding to the specified step, defaulting to the latest
        available if the `step` is -1. Otherwise, it attempts an initial load from a
        specified path (in either native or HF format) or performs loading using
        provided HF assets path from the state dict adapter.

        Args:
            step (int, optional): The training step to restore.
                Defaults to -1 (latest available).

        Returns:
            bool: Whether the checkpoint was successfully located and loaded.
        """

        model_only = False
        from_hf = False
        from_quantized = False

        has_checkpoint_folder = self._storage.isdir(self.folder)
        load_step = -1
        if has_checkpoint_folder:
            load_step = self._find_load_step() if step == -1 else step

        if step != -1 and not has_checkpoint_folder:
            raise FileNotFoundError(
                f"--checkpoint.load_step={step} not found because "
                f"checkpoint.folder {self.folder} does not exist"
            )

        if load_step == -1:
            model_only = self.initial_load_model_only
            from_hf = self.initial_load_in_hf
            from_quantized = self.initial_load_in_hf_quantized

            if from_hf:
                assert model_only, (
                    "Only model can be loaded when loading from "
                    "HF's safetensors checkpoint."
                )
            if from_quantized:
                assert from_hf, "Quantized checkpoint can only be loaded from HF format"

            if self.initial_load_path:
                checkpoint_id = self.initial_load_path
                if not self._storage.isdir(checkpoint_id):
                    raise ValueError(
                        f"Checkpoint.initial_load_path is invalid: {checkpoint_id}"
                    )
                if from_hf:
                    logger.info(
                        "Loading from HF safetensors from "
                        f"--checkpoint.initial_load_path: {checkpoint_id}"
                    )

            elif from_hf:
                assert (
                    self.sd_adapter and self.sd_adapter.hf_assets_path
                ), "from_hf=True requires sd_adapter and hf_assets_path."
                checkpoint_id = self.sd_adapter.hf_assets_path
                if not self._storage.isdir(checkpoint_id):
                    raise ValueError(
                        "model.hf_assets_path is being used to load HF weights "
                        "but the path is not valid. Either make sure hf_assets_path is "
                        "correct or provide a valid checkpoint.initial_load_path"
                    )
                logger.info(
                    "Loading HF safetensors from "
                    f"--model.hf_assets_path: {checkpoint_id}"
                )

            else:
                logger.info("No checkpoint was provided, this is a fresh start.")
                return False

        else:
            # This is the fault-tolerance branch: checkpoint.folder already
            # contains valid checkpoints from a previous run, so we resume from
            # it and all initial_* options are ignored by design. This allows a
            # job to keep the same arguments across automatic restarts after
            # failures.
            step = load_step
            model_only = step == 0
            checkpoint_id = self._create_checkpoint_id(step)

            if not self._storage.isdir(checkpoint_id):
                raise FileNotFoundError(
                    f"--checkpoint.load_step={step} not found at {checkpoint_id}"
                )

        logger.info(f"Loading the checkpoint from {checkpoint_id}.")
        begin = time.monotonic()

        # TODO(checkpoint-rng): Save rank-local training RNG state so same-topology
        # resumes continue exactly. If world size changes, omit it during load and
        # keep each rank's newly initialized RNG stream.
        states = self._states_to_load(model_only)
        self.dcp_load(
            states,
            checkpoint_id=checkpoint_id,
            from_hf=from_hf,
            from_quantized=from_quantized,
        )

        GarbageCollection.collect("GC collection for checkpoint loading.")
        logger.info(
            "Finished loading the checkpoint in "
            f"{time.monotonic() - begin:.2f} seconds."
        )

        return True

    def _maybe_wait_for_staging(self) -> None:
        """Wait for the staging process to complete if it is active.

        In `ASYNC_WITH_PINNED_MEM` mode, the checkpoint data is first staged from
        device (GPU) memory to pinned host (CPU) memory. This staging process is
        asynchronous and designed to overlap with the subsequent training
        computation (forward/backward passes).

        This method ensures that the staging process has finished before the next
        checkpoint cycle begins or before training completes, preventing memory
        contention or race conditions in the pinned memory buffers.

        Raises:
            RuntimeError: If a staging future is detected while asynchronous mode
                isn't ASYNC_WITH_PINNED_MEM.
        """

        if self.staging_future is None:
            return

        if self.async_mode != AsyncMode.ASYNC_WITH_PINNED_MEM:
            raise RuntimeError(
                "self.staging_future is not None, "
                "but self.async_mode isn't ASYNC_WITH_PINNED_MEM."
            )

        self.staging_future.result()
        self.staging_future = None

    def _wait_for_saving(self) -> None:
        """Wait for any async background checkpoint saving operation to complete.

        This is a blocking call that ensures all checkpoint data has been fully
        saved to storage. Upon completion, the tracking future is cleared
        to signify that no background save operations are currently active.

        Raises:
            RuntimeError: If a save future is detected while asynchronous mode
                is DISABLED.
        """

        if self.async_mode == AsyncMode.DISABLED:
            raise RuntimeError(
                "self.save_future is not None, but self.async_mode is DISABLED."
            )

        # Narrowing for the type checker: maybe_wait_for_saving only dispatches
        # here when save_future is set.
        assert self.save_future is not None
        self.save_future.result()
        self.save_future = None

    def _find_load_step(self, folder: str = "") -> int:
        """Identify the highest available checkpoint step in the specified directory.

        This method scans the target folder for subdirectories matching the
        'step-N' pattern. A folder is only considered a valid checkpoint if
        it contains either a DCP metadata file or a HuggingFace safetensors
        index.

        Args:
            folder (str, optional): The directory to scan. Defaults to `self.folder`.

        Returns:
            int: The maximum step number found among valid checkpoints,
                or -1 if no valid checkpoints are detected.

        Note:
            This function is not remote friendly: it issues one listdir plus
            up to two isfile probes per step folder, each a network round trip
            on remote (fsspec) storage instead of a single batched listing.
            Acceptable for now since it only runs once at load time.
        """

        folder = folder or self.folder
        if not self._storage.isdir(folder):
            return -1

        pattern = r"step-(\d+)"
        valid_steps = []

        for filename in self._storage.listdir(folder):
            match = re.search(pattern, filename)
            if not match:
                continue

            # A checkpoint is valid only if it contains core metadata
            checkpoint_path = filesystem.join(folder, filename)
            is_dcp = self._storage.isfile(filesystem.join(checkpoint_path, ".metadata"))
            is_hf = self._storage.isfile(
                filesystem.join(checkpoint_path, "model.safetensors.index.json")
            )

            if is_dcp or is_hf:
                valid_steps.append(int(match.group(1)))

        return max(valid_steps) if valid_steps else -1

    def _create_checkpoint_id(self, step: int, folder: str = "") -> str:
        """Generate the standardized filesystem path for a checkpoint
        (e.g., 'checkpoints/step-100')."""
        folder = folder or self.folder
        return filesystem.join(folder, f"step-{step}")

    def _flattened_model_states_sd(
        self, state_dict: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Extract and flatten model parameters into a single state dictionary.

        This method merges the internal state of the model object into the top-level
        dictionary while keeping auxiliary states (such as optimizers or lr_schedulers)
        unflattened. This ensures a consistent format for the DCP writer.

        Args:
            state_dict (dict[str, Any], optional): A custom dictionary to flatten.
                Defaults to None (uses the instance's internal states).

        Returns:
            dict[str, Any]: A unified dictionary containing both flattened model
                parameters and top-level auxiliary states.
        """
        states = state_dict if state_dict is not None else self.states
        sd = {k: v for k, v in states.items() if k != MODEL}
        if MODEL in states:
            sd.update(states[MODEL].state_dict())
        return sd

    def _states_to_load(self, model_only: bool) -> dict[str, Any]:
        """Determine which state objects should be restored during loading.

        This method filters the checkpointer's state dictionary based on the
        loading context. It supports partial restoration for specific steps
        (e.g., loading only model weights for step 0) and respects explicit
        exclusion rules for auxiliary states.

        Args:
            model_only (bool): If True, returns only the model's parameters,
                bypassing optimizers and other training metadata.

        Returns:
            dict[str, Any]: A prepared dictionary of states to be passed to
                the loader.
        """
        # For the first step, we will only load the model.
        if model_only:
            return self.states[MODEL].state_dict()

        for exclude_key in self.exclude_from_loading:
            if exclude_key not in self.states:
                raise ValueError(f"{exclude_key} not found in state_dict.")

        states_to_load = {
            k: v for k, v in self.states.items() if k not in self.exclude_from_loading
        }

        return self._flattened_model_states_sd(states_to_load)

    def _save_last_step(self, curr_step: int) -> None:
        """Execute the final checkpoint save at the completion of training.

        This method handles the specific requirements for the final training
        artifact. It allows for saving model weights exclusively (stripping
        optimizer states), performing data type conversion for export, and
        optionally formatting the output for HuggingFace compatibility.

        Args:
            curr_step (int): The final training step index.
        """

        # If `last_save_model_only` is False, we save the full training state
        # without dtype conversion to ensure training can be resumed safely.
        # Otherwise, we assume training is fully complete and save only the model
        # with dtype conversion if the current dtype isn't equal to the export dtype.

        if self.last_save_in_hf:
            assert (
                self.last_save_model_only
            ), "Only model can be saved when saving in HF safetensors format."

        if self.last_save_model_only:
            states = self.states[MODEL].state_dict()

            states = {
                k: v.to(self.export_dtype)
                if isinstance(v, torch.Tensor)
                and v.is_floating_point()
                and v.dtype != self.export_dtype
                else v
                for k, v in states.items()
            }
            logger.info(
                f"Saving a model only checkpoint in {self.export_dtype} "
                f"at last step, step {curr_step}."
            )
        else:
            logger.info(f"Saving a full checkpoint at last step, step {curr_step}.")
            states = self._flattened_model_states_sd()

        self.dcp_save(
            states,
            checkpoint_id=self._create_checkpoint_id(curr_step),
            async_mode=AsyncMode.DISABLED,
            enable_garbage_collection=True,
            to_hf=self.last_save_in_hf,
        )

    def _should_save(self, curr_step: int, last_step: bool = False) -> bool:
        """Determine whether a checkpoint should be saved based on
        the current step, interval, and training status."""

        if not self.enable or self.load_only:
            return False

        if curr_step == 1 and self.enable_first_step_checkpoint:
            return True

        if last_step:
            return True

        if curr_step % self.interval == 0:
            return True

        return False

    def _purge_stale_checkpoints(self):
        """Remove older checkpoint directories from storage to maintain
        only the most recent 'k' copies."""
        if self._should_purge():
            discovered_checkpoints = []
            for filename in self._storage.listdir(self.folder):
                match = re.search(r"step-(\d+)", filename)
                if match:
                    path = filesystem.join(self.folder, filename)
                    discovered_checkpoints.append((int(match.group(1)), path))

            discovered_checkpoints.sort()
            to_delete = discovered_checkpoints[: -1 * self.keep_latest_k]

            for _, path in to_delete:
                assert self.purge_thread is not None
                self.purge_queue.put(path)
