// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: generic-netlink transport (family MMIOTNG_GENL_NAME, see
 * mmiotng_abi.h) of the session commands (mmiotng_ctl.c, mmiotng_filters.c).
 *
 * Every command needs CAP_SYS_ADMIN (it rewrites kernel page tables):
 * GENL_ADMIN_PERM only checks CAP_NET_ADMIN, so pre_doit checks
 * CAP_SYS_ADMIN explicitly.  pre_doit takes ng_mutex and, for the commands
 * that change anything (NG_NL_CLAIM), makes the sender the session's
 * owner or refuses it; post_doit drops ng_mutex.  When the owner's socket
 * is released (exit, crash, SIGKILL) the session ends and every page is
 * restored: the socket of the owner's port id in the owner's network
 * namespace, not a socket of another namespace with the same port id.
 * Every command, STATUS too, first checks that the helper's kprobes fire
 * (ng_check_probes); while they do not, commands that change anything
 * are refused (but DISARM_ALL).
 *
 * Locking in this file: every handler runs in process context with
 * ng_mutex held (pre_doit/post_doit); the release notifier takes it too.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/netlink.h>
#include <linux/notifier.h>
#include <linux/slab.h>
#include <net/genetlink.h>

#include "mmiotng.h"

/* genl_small_ops.internal_flags */
#define NG_NL_CLAIM	0x1	/* the command needs the session */

/* what pre_doit/post_doit get: genl_split_ops since 6.2, which added GENL_SET_ERR_MSG_FMT */
#ifdef GENL_SET_ERR_MSG_FMT
#define ng_genl_ops genl_split_ops
#else
#define ng_genl_ops genl_ops
#endif

static struct genl_family ng_family;

static int ng_pre_doit(const struct ng_genl_ops *ops, struct sk_buff *skb, struct genl_info *info)
{
	int ret;

	if (!netlink_capable(skb, CAP_SYS_ADMIN)) {
		GENL_SET_ERR_MSG(info, "CAP_SYS_ADMIN is needed");
		return -EPERM;
	}
	mutex_lock(&ng_mutex);
	if (!ng_check_probes() && (ops->internal_flags & NG_NL_CLAIM) &&
	    ops->cmd != MMIOTNG_CMD_DISARM_ALL) {
		GENL_SET_ERR_MSG(info,
				 "kprobes are disabled (/sys/kernel/debug/kprobes/enabled is 0)");
		mutex_unlock(&ng_mutex);
		return -EHOSTDOWN;
	}
	if (!(ops->internal_flags & NG_NL_CLAIM))
		return 0;
	ret = ng_session_claim(info->snd_portid, genl_info_net(info));
	if (ret == -EBUSY)
		GENL_SET_ERR_MSG(info, "another mmiotrace-ng session controls the helper");
	if (ret == -EALREADY) {
		GENL_SET_ERR_MSG(info, "the kernel's own mmiotrace is active");
		ret = -EBUSY;
	}
	if (ret)
		mutex_unlock(&ng_mutex);
	return ret;
}

static void ng_post_doit(const struct ng_genl_ops *ops, struct sk_buff *skb, struct genl_info *info)
{
	mutex_unlock(&ng_mutex);
}

/* u64 attribute @attr of the request; *ok is cleared (and a message set) if absent */
static u64 ng_get_u64(struct genl_info *info, int attr, bool *ok)
{
	if (info->attrs[attr])
		return nla_get_u64(info->attrs[attr]);
	GENL_SET_ERR_MSG(info, "missing attribute");
	*ok = false;
	return 0;
}

static int ng_cmd_filter_add(struct sk_buff *skb, struct genl_info *info)
{
	bool ok = true;
	u64 phys = ng_get_u64(info, MMIOTNG_A_PHYS, &ok);
	u64 size = ng_get_u64(info, MMIOTNG_A_SIZE, &ok);
	int ret;

	if (!ok)
		return -EINVAL;
	ret = ng_filter_add(phys, size);
	if (ret == -EINVAL)
		GENL_SET_ERR_MSG(info, "not page-aligned, or not inside a PCI memory BAR or ROM");
	else if (ret == -EEXIST)
		GENL_SET_ERR_MSG(info, "range overlaps a filter");
	else if (ret == -ENOSPC)
		GENL_SET_ERR_MSG(info, "too many filters");
	return ret;
}

static int ng_cmd_filter_del(struct sk_buff *skb, struct genl_info *info)
{
	bool ok = true;
	u64 phys = ng_get_u64(info, MMIOTNG_A_PHYS, &ok);
	u64 size = ng_get_u64(info, MMIOTNG_A_SIZE, &ok);

	return ok ? ng_filter_del(phys, size) : -EINVAL;
}

static int ng_cmd_arm_existing(struct sk_buff *skb, struct genl_info *info)
{
	bool ok = true;
	u64 virt = ng_get_u64(info, MMIOTNG_A_VIRT, &ok);
	u64 size = ng_get_u64(info, MMIOTNG_A_SIZE, &ok);
	u64 phys = ng_get_u64(info, MMIOTNG_A_PHYS, &ok);
	int ret;

	if (!ok)
		return -EINVAL;
	ret = ng_arm_existing(virt, size, phys);
	if (ret == -EINVAL)
		GENL_SET_ERR_MSG(info, "not a mapping of that physical range");
	else if (ret == -ENOENT)
		GENL_SET_ERR_MSG(info, "range is not inside a filter");
	else if (ret == -EPERM)
		GENL_SET_ERR_MSG(info, "that is the helper's own mapping");
	else if (ret == -EBUSY)
		GENL_SET_ERR_MSG(info, "the mapping is being unmapped");
	return ret;
}

static int ng_cmd_trace_user(struct sk_buff *skb, struct genl_info *info)
{
	struct nlattr *pids = info->attrs[MMIOTNG_A_USER_PIDS];
	struct nlattr *comms = info->attrs[MMIOTNG_A_USER_COMMS];
	int ret;

	if ((pids && (nla_len(pids) % sizeof(u32) ||
		      nla_len(pids) > MMIOTNG_USER_MAX_PIDS * sizeof(u32))) ||
	    (comms && (nla_len(comms) % MMIOTNG_COMM_LEN ||
		       nla_len(comms) > MMIOTNG_USER_MAX_COMMS * MMIOTNG_COMM_LEN))) {
		GENL_SET_ERR_MSG(info, "bad process filter");
		return -EINVAL;
	}
	ret = ng_user_start(pids ? nla_data(pids) : NULL, pids ? nla_len(pids) / sizeof(u32) : 0,
			    comms ? nla_data(comms) : NULL,
			    comms ? nla_len(comms) / MMIOTNG_COMM_LEN : 0);
	if (ret == -EOPNOTSUPP)
		GENL_SET_ERR_MSG(info, "no CONFIG_NUMA_BALANCING (PROT_NONE entries)");
	else if (ret == -ESRCH)
		GENL_SET_ERR_MSG(info, "no such process");
	else if (ret == -EBUSY)
		GENL_SET_ERR_MSG(info, "processes are traced already");
	else if (ret)
		GENL_SET_ERR_MSG(info, "processes' page faults are not hooked (see dmesg)");
	return ret;
}

static int ng_cmd_arm_user(struct sk_buff *skb, struct genl_info *info)
{
	bool ok = true;
	u64 virt = ng_get_u64(info, MMIOTNG_A_VIRT, &ok);
	u64 size = ng_get_u64(info, MMIOTNG_A_SIZE, &ok);
	int ret;

	if (!ok || !info->attrs[MMIOTNG_A_PID])
		return -EINVAL;
	ret = ng_user_arm(nla_get_u32(info->attrs[MMIOTNG_A_PID]), virt, size);
	if (ret == -EPERM)
		GENL_SET_ERR_MSG(info, "TRACE_USER first");
	else if (ret == -ESRCH)
		GENL_SET_ERR_MSG(info, "no such process (or it has no memory)");
	else if (ret == -EINVAL)
		GENL_SET_ERR_MSG(info, "not a shared PFN mapping of that process");
	else if (ret == -ENOENT)
		GENL_SET_ERR_MSG(info, "not one of the processes traced");
	return ret;
}

static int ng_cmd_disarm_all(struct sk_buff *skb, struct genl_info *info)
{
	ng_session_release(info->snd_portid, genl_info_net(info));
	return 0;
}

static int ng_cmd_set_mode(struct sk_buff *skb, struct genl_info *info)
{
	if (!info->attrs[MMIOTNG_A_MODE]) {
		GENL_SET_ERR_MSG(info, "missing attribute");
		return -EINVAL;
	}
	return ng_set_mode(nla_get_u32(info->attrs[MMIOTNG_A_MODE]));
}

static int ng_cmd_new_devices(struct sk_buff *skb, struct genl_info *info)
{
	ng_trace_new_devices(true);
	return 0;
}

static int ng_cmd_flight_start(struct sk_buff *skb, struct genl_info *info)
{
	char *text = NULL;
	bool ok = true;
	u64 phys = ng_get_u64(info, MMIOTNG_A_PHYS, &ok);
	u64 size = ng_get_u64(info, MMIOTNG_A_SIZE, &ok);
	int ret;

	if (!ok || !info->attrs[MMIOTNG_A_RECS]) {
		GENL_SET_ERR_MSG(info, "missing attribute");
		return -EINVAL;
	}
	if (info->attrs[MMIOTNG_A_TEXT]) {
		text = kzalloc(MMIOTNG_FLIGHT_TEXT, GFP_KERNEL);
		if (!text)
			return -ENOMEM;
		nla_strscpy(text, info->attrs[MMIOTNG_A_TEXT], MMIOTNG_FLIGHT_TEXT);
	}
	ret = ng_flight_start(phys, size, nla_get_u32(info->attrs[MMIOTNG_A_RECS]),
			      text ? text : "");
	kfree(text);
	if (ret == -EINVAL)
		GENL_SET_ERR_MSG(info, "not page-aligned reserved memory, or under 16 records");
	else if (ret == -EBUSY)
		GENL_SET_ERR_MSG(info, "the region is in use (ramoops? another session?)");
	else if (ret == -ENOSPC)
		GENL_SET_ERR_MSG(info, "the region is too small for 16 records per CPU");
	else if (ret == -EPERM)
		GENL_SET_ERR_MSG(info, "the kernel is locked down: no access to physical memory");
	return ret;
}

static int ng_cmd_flight_read(struct sk_buff *skb, struct genl_info *info)
{
	bool ok = true;
	u64 phys = ng_get_u64(info, MMIOTNG_A_PHYS, &ok);
	u64 size = ng_get_u64(info, MMIOTNG_A_SIZE, &ok);
	u64 off = ng_get_u64(info, MMIOTNG_A_OFFSET, &ok);
	struct sk_buff *msg;
	struct nlattr *nla;
	size_t len;
	void *hdr;
	int ret;

	if (!ok)
		return -EINVAL;
	if (off > size) {
		GENL_SET_ERR_MSG(info, "offset past the region");
		return -EINVAL;
	}
	len = min_t(u64, size - off, MMIOTNG_FLIGHT_READ_MAX);
	msg = genlmsg_new(nla_total_size(len) + NLMSG_DEFAULT_SIZE, GFP_KERNEL);
	if (!msg)
		return -ENOMEM;
	hdr = genlmsg_put_reply(msg, info, &ng_family, 0, MMIOTNG_CMD_FLIGHT_READ);
	nla = hdr ? nla_reserve(msg, MMIOTNG_A_FLIGHT_DATA, len) : NULL;
	if (!nla) {
		nlmsg_free(msg);
		return -EMSGSIZE;
	}
	ret = ng_flight_read(phys, size, off, nla_data(nla), len);
	if (ret) {
		nlmsg_free(msg);
		if (ret == -EINVAL)
			GENL_SET_ERR_MSG(info, "not page-aligned reserved memory");
		else if (ret == -EBUSY)
			GENL_SET_ERR_MSG(info, "the region is in use (ramoops? another session?)");
		else if (ret == -EPERM)
			GENL_SET_ERR_MSG(info,
					 "the kernel is locked down: no access to physical memory");
		return ret;
	}
	genlmsg_end(msg, hdr);
	return genlmsg_reply(msg, info);
}

static int ng_cmd_sync(struct sk_buff *skb, struct genl_info *info)
{
	bool ok = true;
	u64 ts = ng_get_u64(info, MMIOTNG_A_SYNC_NS, &ok);
	int ret;

	if (!ok || !info->attrs[MMIOTNG_A_CPU]) {
		GENL_SET_ERR_MSG(info, "missing attribute");
		return -EINVAL;
	}
	ret = ng_sync_ack(nla_get_u32(info->attrs[MMIOTNG_A_CPU]), ts);
	if (ret == -EOPNOTSUPP)
		GENL_SET_ERR_MSG(info, "no preemption count in this kernel (PREEMPT_COUNT)");
	else if (ret == -EINVAL)
		GENL_SET_ERR_MSG(info, "no such CPU");
	return ret;
}

static int ng_put_stats(struct sk_buff *msg)
{
	struct ng_stats st;

	ng_get_stats(&st);
	return nla_put_u64_64bit(msg, MMIOTNG_A_STAT_ARMED_PAGES, st.armed_pages, MMIOTNG_A_PAD) ||
	       nla_put_u64_64bit(msg, MMIOTNG_A_STAT_MAPPINGS, ng_nr_mappings(), MMIOTNG_A_PAD) ||
	       nla_put_u64_64bit(msg, MMIOTNG_A_STAT_FILTERS, ng_nr_filters(), MMIOTNG_A_PAD) ||
	       nla_put_u64_64bit(msg, MMIOTNG_A_STAT_FAULTS, st.faults, MMIOTNG_A_PAD) ||
	       nla_put_u64_64bit(msg, MMIOTNG_A_STAT_EMULATED, st.emulated, MMIOTNG_A_PAD) ||
	       nla_put_u64_64bit(msg, MMIOTNG_A_STAT_SINGLESTEPPED, st.singlestepped,
				 MMIOTNG_A_PAD) ||
	       nla_put_u64_64bit(msg, MMIOTNG_A_STAT_UNKNOWN, st.unknown, MMIOTNG_A_PAD) ||
	       nla_put_u64_64bit(msg, MMIOTNG_A_STAT_REFUSED, st.refused, MMIOTNG_A_PAD) ||
	       nla_put_u64_64bit(msg, MMIOTNG_A_STAT_RETRIED, st.retried, MMIOTNG_A_PAD) ||
	       nla_put_u32(msg, MMIOTNG_A_STAT_OWNER, ng_session_owner()) ||
	       nla_put_u32(msg, MMIOTNG_A_STAT_ABI_VERSION, MMIOTNG_ABI_VERSION) ||
	       nla_put_u64_64bit(msg, MMIOTNG_A_STAT_STALE, st.stale, MMIOTNG_A_PAD) ||
	       nla_put_u32(msg, MMIOTNG_A_STAT_PROBES_OFF, ng_probes_were_off()) ||
	       nla_put_u64_64bit(msg, MMIOTNG_A_STAT_MISSED, ng_probes_missed(), MMIOTNG_A_PAD) ||
	       nla_put_u64_64bit(msg, MMIOTNG_A_STAT_SPARE_BYTES, ng_spare_bytes(),
				 MMIOTNG_A_PAD) ||
	       nla_put_u64_64bit(msg, MMIOTNG_A_STAT_FLIGHT_RECS, ng_flight_recs(),
				 MMIOTNG_A_PAD) ||
	       nla_put_u64_64bit(msg, MMIOTNG_A_STAT_SYNC_LATE, st.sync_late, MMIOTNG_A_PAD);
}

static int ng_cmd_status(struct sk_buff *skb, struct genl_info *info)
{
	struct sk_buff *msg;
	void *hdr;

	msg = genlmsg_new(NLMSG_DEFAULT_SIZE, GFP_KERNEL);
	if (!msg)
		return -ENOMEM;
	hdr = genlmsg_put_reply(msg, info, &ng_family, 0, MMIOTNG_CMD_STATUS);
	if (!hdr || ng_put_stats(msg)) {
		nlmsg_free(msg);
		return -EMSGSIZE;
	}
	genlmsg_end(msg, hdr);
	return genlmsg_reply(msg, info);
}

/* from MMIOTNG_ATTRS: requests carry REQ attributes only */
#define NG_POLICY_REQ(t)	NLA_##t
#define NG_POLICY_REPLY(t)	NLA_REJECT
#define NG_POLICY(n, t, dir) \
	[MMIOTNG_A_##n] = { .type = NG_POLICY_##dir(t) },

static const struct nla_policy ng_policy[MMIOTNG_A_MAX + 1] = {
	MMIOTNG_ATTRS(NG_POLICY)
	[MMIOTNG_A_PAD] = { .type = NLA_REJECT },
};

#define NG_OP(c, fn, iflags) \
	{ .cmd = (c), .doit = (fn), .flags = GENL_ADMIN_PERM, .internal_flags = (iflags) }

static const struct genl_small_ops ng_ops[] = {
	NG_OP(MMIOTNG_CMD_FILTER_ADD, ng_cmd_filter_add, NG_NL_CLAIM),
	NG_OP(MMIOTNG_CMD_FILTER_DEL, ng_cmd_filter_del, NG_NL_CLAIM),
	NG_OP(MMIOTNG_CMD_ARM_EXISTING, ng_cmd_arm_existing, NG_NL_CLAIM),
	NG_OP(MMIOTNG_CMD_DISARM_ALL, ng_cmd_disarm_all, NG_NL_CLAIM),
	NG_OP(MMIOTNG_CMD_STATUS, ng_cmd_status, 0),
	NG_OP(MMIOTNG_CMD_SET_MODE, ng_cmd_set_mode, NG_NL_CLAIM),
	NG_OP(MMIOTNG_CMD_NEW_DEVICES, ng_cmd_new_devices, NG_NL_CLAIM),
	NG_OP(MMIOTNG_CMD_FLIGHT_START, ng_cmd_flight_start, NG_NL_CLAIM),
	NG_OP(MMIOTNG_CMD_FLIGHT_READ, ng_cmd_flight_read, 0),
	NG_OP(MMIOTNG_CMD_SYNC, ng_cmd_sync, NG_NL_CLAIM),
	NG_OP(MMIOTNG_CMD_TRACE_USER, ng_cmd_trace_user, NG_NL_CLAIM),
	NG_OP(MMIOTNG_CMD_ARM_USER, ng_cmd_arm_user, NG_NL_CLAIM),
};

static struct genl_family ng_family __ro_after_init = {
	.name = MMIOTNG_GENL_NAME,
	.version = MMIOTNG_GENL_VERSION,
	.maxattr = MMIOTNG_A_MAX,
	.policy = ng_policy,
	.module = THIS_MODULE,
	/* SYNC must not wait for genl_mutex: ng_mutex serializes the commands */
	.parallel_ops = true,
	.pre_doit = ng_pre_doit,
	.post_doit = ng_post_doit,
	.small_ops = ng_ops,
	.n_small_ops = ARRAY_SIZE(ng_ops),
};

/* A socket is gone: if it owned the session, nothing may stay armed. */
static int ng_netlink_event(struct notifier_block *nb, unsigned long event, void *ptr)
{
	struct netlink_notify *n = ptr;

	if (event != NETLINK_URELEASE || n->protocol != NETLINK_GENERIC)
		return NOTIFY_DONE;
	mutex_lock(&ng_mutex);
	ng_session_release(n->portid, n->net);
	mutex_unlock(&ng_mutex);
	return NOTIFY_DONE;
}

static struct notifier_block ng_netlink_nb = {
	.notifier_call = ng_netlink_event,
};

int ng_nl_init(void)
{
	int ret = netlink_register_notifier(&ng_netlink_nb);

	if (ret)
		return ret;
	ret = genl_register_family(&ng_family);
	if (ret)
		netlink_unregister_notifier(&ng_netlink_nb);
	return ret;
}

void ng_nl_exit(void)
{
	genl_unregister_family(&ng_family);
	netlink_unregister_notifier(&ng_netlink_nb);
}
