// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: the trap engine of mmiotrace-ng.
 *
 * Pages of ioremapped ranges that belong to traced devices are made
 * not-present (mmiotng_pages.c, armed from the ioremap probes in
 * mmiotng_probes.c).  Every access to them faults; the fault is taken over
 * (mmiotng_fault.c), the instruction decoded (ng_decode.c) and performed
 * through a per-CPU window onto the device page, with the driver's memory
 * type (mmiotng_window.c), and the access reported through a tracepoint.
 * The page stays not-present, so every CPU keeps faulting and no access is
 * missed: no CPU needs to be offlined.  Instructions the decoder does not know are single-stepped
 * (mmiotng_step.c).  Control is a generic-netlink family (mmiotng_nl.c,
 * mmiotng_ctl.c): when the controlling socket closes, for whatever reason,
 * everything is disarmed.  See mmiotng.h for the locking rules.
 *
 * This file: module init and exit.  Init installs the handlers before the
 * probes that arm anything and the control interface last; exit takes the
 * control interface away first, disarms everything, then removes the
 * probes and finally the fault handler.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/rcupdate.h>

#include "mmiotng.h"
#include "mmiotng_compat.h"

static int __init ng_init(void)
{
	const char *why = NULL;
	int ret;

	ret = ng_compat_check(&why);
	if (ret) {
		pr_err("cannot serve this machine: %s\n", why);
		return ret;
	}
	ng_flush_init();
	ret = ng_windows_init();
	if (ret)
		return ret;
	ret = ng_report_init();
	if (ret)
		goto err_windows;
	ret = ng_step_init();
	if (ret)
		goto err_report;
	ret = ng_fault_init();
	if (ret)
		goto err_step;
	ret = ng_probes_init();
	if (ret)
		goto err_fault;
	ret = ng_hooks_init();
	if (ret)
		goto err_probes;
	ret = ng_pci_init();
	if (ret)
		goto err_hooks;
	ret = ng_flight_init();
	if (ret)
		goto err_pci;
	ng_user_init();
	ret = ng_nl_init();
	if (ret)
		goto err_user;
	return 0;

err_user:
	ng_user_exit();
	ng_flight_exit();
err_pci:
	ng_pci_exit();
err_hooks:
	ng_hooks_exit();
err_probes:
	ng_probes_exit();
err_fault:
	ng_fault_exit();
err_step:
	ng_step_exit();
err_report:
	ng_report_exit();
err_windows:
	ng_windows_exit();
	return ret;
}

static void __exit ng_exit(void)
{
	ng_nl_exit();
	mutex_lock(&ng_mutex);
	ng_sync_stop();
	mutex_unlock(&ng_mutex);
	ng_flight_exit();
	ng_pci_exit();
	ng_hooks_exit();
	mutex_lock(&ng_mutex);
	ng_disarm_all();
	mutex_unlock(&ng_mutex);
	ng_user_exit();
	ng_probes_exit();
	ng_fault_exit();
	ng_step_exit();
	ng_report_exit();	/* the last steps' records */
	ng_flush_sync();
	ng_windows_exit();
	rcu_barrier();
}

module_init(ng_init);
module_exit(ng_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("mmiotrace-ng trap engine: traces MMIO of chosen devices");
