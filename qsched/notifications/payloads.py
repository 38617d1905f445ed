"""Nova's versioned notification payloads, built from what qsched knows; pure.

Each payload is Nova's object serialized as Nova does (``nova_object.name``,
``.namespace``, ``.version``, ``.data``), with Nova's field names and versions
(``nova/notifications/objects/``): ``InstanceCreatePayload`` 1.13 for
``instance.create.*``, ``InstanceActionPayload`` 1.9 for ``instance.delete.*``,
``FlavorPayload`` 1.4 and ``ExceptionPayload`` 1.1 inside them. A field qsched has
no value for is null, or empty for a list or a map (docs/notifications.rst lists
them). qsched's own claim event, which has no Nova counterpart, carries
``ClaimPayload`` 1.0 in the ``qsched`` namespace.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from qsched.ledger.records import Instance, State, TaskState
from qsched.scheduling.message import BootRequest

CREATE_VERSION = "1.13"
ACTION_VERSION = "1.9"
FLAVOR_VERSION = "1.4"
EXCEPTION_VERSION = "1.1"
CLAIM_VERSION = "1.0"

#: qsched's states as Nova's vm_state (a stopped instance is ``stopped``).
VM_STATES = {State.BUILD: "building", State.ACTIVE: "active", State.ERROR: "error",
             State.DELETED: "deleted"}  # fmt: skip


def envelope(name: str, version: str, data: Mapping[str, Any], namespace: str = "nova") -> dict:
    """An object as Nova serializes it into a notification."""
    return {
        "nova_object.name": name,
        "nova_object.namespace": namespace,
        "nova_object.version": version,
        "nova_object.data": dict(data),
    }


def timestamp(epoch_s: float | None) -> str | None:
    """Nova's DateTimeField on the wire: ``2012-10-29T13:42:11Z``; None stays None."""
    return None if not epoch_s else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_s))


def flavor(flavor_dict: Mapping[str, Any]) -> dict:
    """``FlavorPayload`` 1.4 from a boot request's or a record's flavor."""
    return envelope("FlavorPayload", FLAVOR_VERSION, {
        "flavorid": flavor_dict.get("id"),
        "name": flavor_dict.get("name"),
        "memory_mb": flavor_dict.get("ram_mb"),
        "vcpus": flavor_dict.get("vcpus"),
        "root_gb": flavor_dict.get("disk_gb"),
        "ephemeral_gb": flavor_dict.get("ephemeral_gb", 0),
        "swap": flavor_dict.get("swap_mb", 0),
        "rxtx_factor": None,
        "vcpu_weight": None,
        "disabled": False,
        "is_public": True,
        "extra_specs": {str(k): str(v) for k, v in (flavor_dict.get("extra_specs") or {}).items()},
        "projects": None,
        "description": None,
    })  # fmt: skip


def fault(message: str, exception_name: str = "NoValidHost", module: str = "qsched.recovery.reaper",
          function: str = "fail_no_valid_host") -> dict:  # fmt: skip
    """``ExceptionPayload`` 1.1: the fault an instance ended in ERROR with."""
    return envelope("ExceptionPayload", EXCEPTION_VERSION, {
        "module_name": module,
        "function_name": function,
        "exception": exception_name,
        "exception_message": message,
        "traceback": "",
    })  # fmt: skip


def _instance_data(
    uuid: str, user_id: str, project_id: str, flavor_dict: Mapping[str, Any], **known: Any
) -> dict[str, Any]:
    """``InstanceActionPayload``'s fields: those qsched has from ``known``, the rest null."""
    data: dict[str, Any] = {
        "uuid": uuid, "user_id": user_id, "tenant_id": project_id,
        "reservation_id": None, "display_name": None, "display_description": None,
        "host_name": None, "host": None, "node": None, "os_type": None,
        "architecture": None, "availability_zone": None, "flavor": flavor(flavor_dict),
        "image_uuid": None, "key_name": None, "kernel_id": "", "ramdisk_id": "",
        "created_at": None, "launched_at": None, "terminated_at": None,
        "deleted_at": None, "updated_at": None, "state": None, "power_state": None,
        "task_state": None, "progress": 0, "ip_addresses": [], "block_devices": [],
        "metadata": {}, "locked": False, "auto_disk_config": "MANUAL",
        "request_id": None, "action_initiator_user": user_id,
        "action_initiator_project": project_id, "locked_reason": None, "shares": [],
        "fault": None,
    }  # fmt: skip
    data.update(known)
    return data


def create_from_request(
    msg: BootRequest, host: str, node: str, state: str, task_state: str | None,
    power_state: str, launched_at: float | None = None,
) -> dict:  # fmt: skip
    """``InstanceCreatePayload`` 1.13 of a boot request claimed on ``host``/``node``.

    Built from the request alone (no ledger read per placement): the record's name
    and times are not in it, so ``display_name`` and ``created_at`` are null.
    """
    data = _instance_data(
        msg.instance_uuid, msg.user_id, msg.project_id, msg.flavor, host=host, node=node,
        availability_zone=msg.availability_zone, state=state, task_state=task_state,
        power_state=power_state, launched_at=timestamp(launched_at),
        request_id=msg.request_id,
    )  # fmt: skip
    data.update(keypairs=[], tags=[], trusted_image_certificates=None, instance_name=None)
    return envelope("InstanceCreatePayload", CREATE_VERSION, data)


def create_ended(started: Mapping[str, Any], launched_at: float) -> dict:
    """``instance.create.end``'s payload from the ``.start`` one
    :func:`create_from_request` built at the claim: the same but for the states and
    the launch time (a copy of its fields rather than all of them built again)."""
    data = dict(started["nova_object.data"])
    data.update(state="active", task_state=None, power_state="running",
                launched_at=timestamp(launched_at))  # fmt: skip
    return {**started, "nova_object.data": data}


def _record_data(inst: Instance, **known: Any) -> dict[str, Any]:
    vm_state = "stopped" if inst.stopped else VM_STATES[inst.state]
    task = inst.task_state.value if inst.task_state is not TaskState.NONE else None
    power = "pending"
    if inst.state == State.ACTIVE:
        power = "shutdown" if inst.stopped else "running"
    fields: dict[str, Any] = {
        "display_name": inst.name, "host": inst.host, "node": inst.node,
        "reservation_id": inst.batch, "state": vm_state, "task_state": task,
        "power_state": power, "created_at": timestamp(inst.created_at),
        "launched_at": timestamp(inst.launched_at), "updated_at": timestamp(inst.updated_at),
    }  # fmt: skip
    fields.update(known)
    return _instance_data(inst.uuid, inst.user_id, inst.project_id, inst.flavor, **fields)


def create_from_record(inst: Instance, fault_payload: Mapping[str, Any] | None = None) -> dict:
    """``InstanceCreatePayload`` 1.13 of an instance record (``instance.create.error``)."""
    data = _record_data(inst, fault=dict(fault_payload) if fault_payload else None)
    data.update(keypairs=[], tags=[], trusted_image_certificates=None,
                instance_name=inst.name)  # fmt: skip
    return envelope("InstanceCreatePayload", CREATE_VERSION, data)


def action_from_record(inst: Instance, **known: Any) -> dict:
    """``InstanceActionPayload`` 1.9 of an instance record (``instance.delete.*``)."""
    return envelope("InstanceActionPayload", ACTION_VERSION, _record_data(inst, **known))


def deleted(inst: Instance) -> dict:
    """``InstanceActionPayload`` 1.9 of a record just ended DELETED (``.delete.end``)."""
    now = timestamp(time.time())
    return action_from_record(inst, terminated_at=now, deleted_at=now, power_state="nostate")


def claim(msg: BootRequest, host: str, node: str, allocations: Mapping[str, Any]) -> dict:
    """qsched's ``ClaimPayload`` 1.0: where a boot request was placed, and with what."""
    return envelope("ClaimPayload", CLAIM_VERSION, {
        "instance_uuid": msg.instance_uuid, "request_id": msg.request_id,
        "tenant_id": msg.project_id, "user_id": msg.user_id,
        "scheduling_class": msg.scheduling_class, "host": host, "node": node,
        "attempt": msg.attempt, "tried_hosts": list(msg.tried_hosts),
        "allocations": {rp: dict(amounts) for rp, amounts in allocations.items()},
    }, namespace="qsched")  # fmt: skip


def context(msg: BootRequest) -> dict[str, Any]:
    """The request context a notification carries, as Nova's serialized one names it."""
    return {"request_id": msg.request_id, "global_request_id": msg.global_request_id,
            "user_id": msg.user_id, "project_id": msg.project_id}  # fmt: skip
