// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: generic-netlink control (family MMIOTNG_GENL_NAME, see
 * mmiotng_abi.h).
 *
 * The first socket to change anything owns the session; other sockets get
 * -EBUSY until it disarms or closes.  When the owner's socket is released
 * (exit, crash, SIGKILL) every filter and mapping is dropped and every
 * page restored.  All commands need CAP_SYS_ADMIN (GENL_ADMIN_PERM) and
 * run under ng_mutex, which also orders them against the release.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/netlink.h>
#include <linux/notifier.h>
#include <net/genetlink.h>

#include "mmiotng.h"

static u32 ng_owner;	/* netlink port id of the controller; ng_mutex */

bool ng_session_active(void)
{
	return READ_ONCE(ng_owner) != 0;
}

static struct genl_family ng_family;

/* Make the sender the owner, or refuse if someone else is. */
static int ng_claim(struct genl_info *info)
{
	if (ng_owner && ng_owner != info->snd_portid) {
		GENL_SET_ERR_MSG(info, "another mmiotrace-ng session controls the helper");
		return -EBUSY;
	}
	ng_owner = info->snd_portid;
	return 0;
}

/*
 * Fail with a message when a required attribute is missing.  A macro, as
 * the message must be a literal; info is evaluated once.
 */
#define ng_need(info, attr, what) ({					\
	struct genl_info *__info = (info);				\
	int __ret = 0;							\
	if (!__info->attrs[attr]) {					\
		GENL_SET_ERR_MSG(__info, "missing attribute " what);	\
		__ret = -EINVAL;					\
	}								\
	__ret;								\
})

static int ng_cmd_filter_add(struct sk_buff *skb, struct genl_info *info)
{
	int ret;

	ret = ng_need(info, MMIOTNG_A_PHYS, "PHYS") ?:
	      ng_need(info, MMIOTNG_A_SIZE, "SIZE");
	if (ret)
		return ret;
	if (ng_kernel_mmiotrace_active()) {
		GENL_SET_ERR_MSG(info, "the kernel's own mmiotrace is active");
		return -EBUSY;
	}
	mutex_lock(&ng_mutex);
	ret = ng_claim(info);
	if (!ret)
		ret = ng_filter_add(nla_get_u64(info->attrs[MMIOTNG_A_PHYS]),
				    nla_get_u64(info->attrs[MMIOTNG_A_SIZE]));
	if (ret == -EINVAL)
		GENL_SET_ERR_MSG(info, "range must be page-aligned device memory");
	else if (ret == -EEXIST)
		GENL_SET_ERR_MSG(info, "range overlaps a filter");
	mutex_unlock(&ng_mutex);
	return ret;
}

static int ng_cmd_filter_del(struct sk_buff *skb, struct genl_info *info)
{
	int ret;

	ret = ng_need(info, MMIOTNG_A_PHYS, "PHYS") ?:
	      ng_need(info, MMIOTNG_A_SIZE, "SIZE");
	if (ret)
		return ret;
	mutex_lock(&ng_mutex);
	ret = ng_claim(info);
	if (!ret)
		ret = ng_filter_del(nla_get_u64(info->attrs[MMIOTNG_A_PHYS]),
				    nla_get_u64(info->attrs[MMIOTNG_A_SIZE]));
	mutex_unlock(&ng_mutex);
	return ret;
}

static int ng_cmd_arm_existing(struct sk_buff *skb, struct genl_info *info)
{
	int ret;

	ret = ng_need(info, MMIOTNG_A_VIRT, "VIRT") ?:
	      ng_need(info, MMIOTNG_A_SIZE, "SIZE") ?:
	      ng_need(info, MMIOTNG_A_PHYS, "PHYS");
	if (ret)
		return ret;
	mutex_lock(&ng_mutex);
	ret = ng_claim(info);
	if (!ret)
		ret = ng_arm_existing(nla_get_u64(info->attrs[MMIOTNG_A_VIRT]),
				      nla_get_u64(info->attrs[MMIOTNG_A_SIZE]),
				      nla_get_u64(info->attrs[MMIOTNG_A_PHYS]));
	if (ret == -EINVAL)
		GENL_SET_ERR_MSG(info, "not a mapping of that physical range");
	else if (ret == -ENOENT)
		GENL_SET_ERR_MSG(info, "range is not inside a filter");
	else if (ret == -EPERM)
		GENL_SET_ERR_MSG(info, "that is the helper's own mapping");
	mutex_unlock(&ng_mutex);
	return ret;
}

static int ng_cmd_disarm_all(struct sk_buff *skb, struct genl_info *info)
{
	int ret;

	mutex_lock(&ng_mutex);
	ret = ng_claim(info);
	if (!ret) {
		ng_disarm_all();
		ng_owner = 0;
	}
	mutex_unlock(&ng_mutex);
	return ret;
}

static int ng_cmd_set_mode(struct sk_buff *skb, struct genl_info *info)
{
	int ret = ng_need(info, MMIOTNG_A_MODE, "MODE");

	if (ret)
		return ret;
	mutex_lock(&ng_mutex);
	ret = ng_claim(info);
	if (!ret)
		ret = ng_set_mode(nla_get_u32(info->attrs[MMIOTNG_A_MODE]));
	mutex_unlock(&ng_mutex);
	return ret;
}

static int ng_cmd_status(struct sk_buff *skb, struct genl_info *info)
{
	struct ng_stats st;
	struct sk_buff *msg;
	void *hdr;
	u32 owner;

	mutex_lock(&ng_mutex);
	ng_get_stats(&st);
	owner = ng_owner;
	mutex_unlock(&ng_mutex);

	msg = genlmsg_new(NLMSG_DEFAULT_SIZE, GFP_KERNEL);
	if (!msg)
		return -ENOMEM;
	hdr = genlmsg_put_reply(msg, info, &ng_family, 0, MMIOTNG_CMD_STATUS);
	if (!hdr)
		goto nospace;
	if (nla_put_u64_64bit(msg, MMIOTNG_A_STAT_ARMED_PAGES, st.armed_pages, MMIOTNG_A_UNSPEC) ||
	    nla_put_u64_64bit(msg, MMIOTNG_A_STAT_MAPPINGS, st.mappings, MMIOTNG_A_UNSPEC) ||
	    nla_put_u64_64bit(msg, MMIOTNG_A_STAT_FILTERS, st.filters, MMIOTNG_A_UNSPEC) ||
	    nla_put_u64_64bit(msg, MMIOTNG_A_STAT_FAULTS, st.faults, MMIOTNG_A_UNSPEC) ||
	    nla_put_u64_64bit(msg, MMIOTNG_A_STAT_EMULATED, st.emulated, MMIOTNG_A_UNSPEC) ||
	    nla_put_u64_64bit(msg, MMIOTNG_A_STAT_SINGLESTEPPED, st.singlestepped,
			      MMIOTNG_A_UNSPEC) ||
	    nla_put_u64_64bit(msg, MMIOTNG_A_STAT_UNKNOWN, st.unknown, MMIOTNG_A_UNSPEC) ||
	    nla_put_u32(msg, MMIOTNG_A_STAT_OWNER, owner))
		goto nospace;
	genlmsg_end(msg, hdr);
	return genlmsg_reply(msg, info);

nospace:
	nlmsg_free(msg);
	return -EMSGSIZE;
}

static const struct nla_policy ng_policy[MMIOTNG_A_MAX + 1] = {
	[MMIOTNG_A_PHYS] = { .type = NLA_U64 },
	[MMIOTNG_A_SIZE] = { .type = NLA_U64 },
	[MMIOTNG_A_VIRT] = { .type = NLA_U64 },
	[MMIOTNG_A_MODE] = { .type = NLA_U32 },
};

static const struct genl_small_ops ng_ops[] = {
	{ .cmd = MMIOTNG_CMD_FILTER_ADD, .doit = ng_cmd_filter_add, .flags = GENL_ADMIN_PERM },
	{ .cmd = MMIOTNG_CMD_FILTER_DEL, .doit = ng_cmd_filter_del, .flags = GENL_ADMIN_PERM },
	{ .cmd = MMIOTNG_CMD_ARM_EXISTING, .doit = ng_cmd_arm_existing,
	  .flags = GENL_ADMIN_PERM },
	{ .cmd = MMIOTNG_CMD_DISARM_ALL, .doit = ng_cmd_disarm_all, .flags = GENL_ADMIN_PERM },
	{ .cmd = MMIOTNG_CMD_STATUS, .doit = ng_cmd_status, .flags = GENL_ADMIN_PERM },
	{ .cmd = MMIOTNG_CMD_SET_MODE, .doit = ng_cmd_set_mode, .flags = GENL_ADMIN_PERM },
};

static struct genl_family ng_family __ro_after_init = {
	.name = MMIOTNG_GENL_NAME,
	.version = MMIOTNG_GENL_VERSION,
	.maxattr = MMIOTNG_A_MAX,
	.policy = ng_policy,
	.module = THIS_MODULE,
	.small_ops = ng_ops,
	.n_small_ops = ARRAY_SIZE(ng_ops),
};

/* The controller's socket is gone: nothing may stay armed. */
static int ng_netlink_event(struct notifier_block *nb, unsigned long event, void *ptr)
{
	struct netlink_notify *n = ptr;

	if (event != NETLINK_URELEASE || n->protocol != NETLINK_GENERIC)
		return NOTIFY_DONE;
	mutex_lock(&ng_mutex);
	if (ng_owner && n->portid == ng_owner) {
		ng_disarm_all();
		ng_owner = 0;
	}
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
