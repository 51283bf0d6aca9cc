// SPDX-License-Identifier: GPL-2.0
/*
 * mmiotng: traced BARs mapped into processes (an mmap of a sysfs resourceN
 * file, a driver's remap_pfn_range() into a VMA).
 *
 * Arming: each entry of a shared VM_PFNMAP VMA that maps a page of a
 * filter becomes PROT_NONE as the kernel's NUMA balancing makes one: not
 * present to the CPU, present to the mm (pte_present(), pte_pfn()).  So
 * fork copies it, munmap, mremap and exit handle it as the page it
 * is, and the range's PAT reservation stays.  A fault on it reaches
 * handle_mm_fault(), hooked here by an ftrace ops with IPMODIFY (as the
 * kernel-side hook, mmiotng_fault.c): an access from user mode is emulated
 * through the CPU's window and reported with the task's pid and its user
 * PC, and the call then returns 0 (handled) in place of handle_mm_fault().
 * Anything else (a kernel-mode access through the mapping, a 32-bit task,
 * an instruction the decoder does not know, a missing user page on the
 * other side of a movs) runs handle_mm_fault() as without the helper:
 * do_numa_page() makes the entry present again, and that page runs
 * untraced from then on, which the trace says.  An entry left armed (a
 * process that could not be locked at disarm, the helper gone) is made
 * present the same way at its next access: never a signal, never a hang.
 * Without CONFIG_NUMA_BALANCING (pte_protnone() always false) nothing is
 * armed here.
 *
 * Arming happens when remap_pfn_range() returns 0 (a kretprobe; the mmap
 * or fault path that called it holds the mm's mmap_lock) and for the
 * mappings processes hold at the start (ARM_USER, with the mmap_lock
 * taken here).  Every process is disarmed when the session ends.
 *
 * Locking in this file:
 *  - An entry is only changed with a cmpxchg from the value read, under
 *    the mm's mmap_lock (read or write): page tables of a VM_PFNMAP VMA
 *    are not freed under it.  Other writers of its entries (the CPU's
 *    accessed/dirty bits, do_numa_page(), a driver's fault handler making
 *    one writable, all under the PTE lock, which a module cannot take on
 *    current kernels) win against it: arming retries while only those
 *    bits changed; a disarm that loses leaves what they made (present).
 *  - ng_user_ftrace() runs in the faulting task with the VMA locked (the
 *    mmap_lock for read, or the per-VMA lock), preemptible: the entry is
 *    read without a lock, and again with interrupts off before the access
 *    (an unmap of the BAR that won has flushed this CPU by then, or waits
 *    for it); the filter is looked up under ng_lock and used under RCU
 *    (filters are freed after a grace period).  Emulation runs with
 *    interrupts off at level 0.  It arms nothing.
 *  - ng_user_remap_ret() runs in the task that called remap_pfn_range(),
 *    with preemption off: no sleeping lock (PTE locks sleep on PREEMPT_RT).
 *  - ARM_USER and the disarm run in process context with ng_mutex held,
 *    and take each mm's mmap_lock for read (the disarm only tries: a
 *    process that holds it for long keeps its entries armed, which is
 *    safe, see above).
 *  - ng_user_on: written under ng_mutex, read anywhere with READ_ONCE.
 *  - The process filter (ng_user_pids, ng_user_comms): written under
 *    ng_mutex while ng_user_on is false, before it is set (release);
 *    read by the hook and the probe without a lock.  A pid there holds a
 *    reference, put at the stop after the grace period that ends the
 *    hook's and the probe's readers; they only compare the pointers.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/ftrace.h>
#include <linux/kprobes.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
#include <linux/pid.h>
#include <linux/pid_namespace.h>
#include <linux/rcupdate.h>
#include <linux/sched/mm.h>
#include <linux/sched/task.h>
#include <asm/pgtable.h>

#include "mmiotng.h"
#include "mmiotng_compat.h"

static bool ng_user_on;

/* the processes traced (TRACE_USER's filter), none: all */
static struct pid *ng_user_pids[MMIOTNG_USER_MAX_PIDS];
static unsigned int ng_user_npids;
static char ng_user_comms[MMIOTNG_USER_MAX_COMMS][TASK_COMM_LEN];
static unsigned int ng_user_ncomms;

/* Whether task t's accesses to user mappings are traced (the filter). */
static bool ng_user_wanted(struct task_struct *t)
{
	unsigned int i, npids = READ_ONCE(ng_user_npids), ncomms = READ_ONCE(ng_user_ncomms);

	if (!npids && !ncomms)
		return true;
	for (i = 0; i < npids && i < MMIOTNG_USER_MAX_PIDS; i++)
		if (task_tgid(t) == READ_ONCE(ng_user_pids[i]))
			return true;
	/* the thread's name or its process's (a worker thread names itself) */
	for (i = 0; i < ncomms && i < MMIOTNG_USER_MAX_COMMS; i++)
		if (!strncmp(t->comm, ng_user_comms[i], TASK_COMM_LEN) ||
		    !strncmp(t->group_leader->comm, ng_user_comms[i], TASK_COMM_LEN))
			return true;
	return false;
}

/* a 4K entry of mm at addr (a VM_PFNMAP VMA's: no huge page), or NULL; mmap_lock held */
static pte_t *ng_user_pte(struct mm_struct *mm, unsigned long addr)
{
	pgd_t *pgd = pgd_offset(mm, addr);
	p4d_t *p4d;
	pud_t *pud;
	pmd_t *pmd, pmdval;

	if (pgd_none(*pgd) || pgd_bad(*pgd))
		return NULL;
	p4d = p4d_offset(pgd, addr);
	if (p4d_none(*p4d) || p4d_bad(*p4d))
		return NULL;
	pud = pud_offset(p4d, addr);
	if (pud_none(*pud) || pud_leaf(*pud) || pud_bad(*pud))
		return NULL;
	pmd = pmd_offset(pud, addr);
	pmdval = READ_ONCE(*pmd);
	if (pmd_none(pmdval) || pmd_leaf(pmdval) || pmd_bad(pmdval))
		return NULL;
	return pte_offset_kernel(&pmdval, addr);	/* the table seen, not a later one */
}

/* Whether pte is an entry armed here: PROT_NONE, of a special (PFN) mapping. */
static bool ng_user_armed(pte_t pte)
{
	return pte_protnone(pte) && pte_special(pte);
}

/*
 * The entry armed: not present, PROT_NONE (the global bit, never set in a
 * user entry), its frame number inverted as the kernel keeps a PROT_NONE
 * entry's (L1TF); every other bit as it was.  (pte_modify() is not for
 * modules on every kernel.)
 */
static pte_t ng_user_arm_entry(pte_t pte)
{
	pteval_t old = pte_val(pte), v = (old & ~(pteval_t)_PAGE_PRESENT) | _PAGE_PROTNONE;

	return __pte(flip_protnone_guard(old, v, PTE_PFN_MASK));
}

/* The entry as it was before ng_user_arm_entry() (accessed, too). */
static pte_t ng_user_disarm_entry(pte_t pte)
{
	pteval_t old = pte_val(pte);
	pteval_t v = (old & ~(pteval_t)_PAGE_PROTNONE) | _PAGE_PRESENT | _PAGE_ACCESSED;

	return __pte(flip_protnone_guard(old, v, PTE_PFN_MASK));
}

static bool ng_user_swap(pte_t *ptep, pte_t old, pte_t new)
{
	return cmpxchg64((u64 *)&ptep->pte, pte_val(old), pte_val(new)) == pte_val(old);
}

/*
 * Whether the VMA is one whose entries are armed: a PFN map, not
 * copy-on-write (shared, or read-only from a read-only open), accessible,
 * of 4K entries only.
 */
static bool ng_user_vma(struct vm_area_struct *vma)
{
	return IS_ENABLED(CONFIG_NUMA_BALANCING) && (vma->vm_flags & VM_PFNMAP) &&
	       !is_cow_mapping(vma->vm_flags) &&
	       !(vma->vm_ops && vma->vm_ops->huge_fault) && vma_is_accessible(vma);
}

/* Whether the page at phys holds traced bytes (a filter overlaps it). */
static bool ng_user_traced(phys_addr_t phys)
{
	unsigned long irqs;
	bool ret;

	ng_lock_irqsave(&irqs);
	ret = ng_overlaps_filter(phys, PAGE_SIZE);
	ng_unlock_irqrestore(irqs);
	return ret;
}

/* Past the PMD of addr (the walk's next address when it has no 4K table there). */
static unsigned long ng_user_next_pmd(unsigned long addr)
{
	return (addr | (PMD_SIZE - 1)) + 1;
}

/*
 * Arm one entry if it maps a traced page: retried while only its
 * accessed/dirty bits change under the cmpxchg.
 */
static bool ng_user_arm_pte(pte_t *ptep)
{
	pte_t pte = ptep_get(ptep);
	int tries;

	if (!pte_present(pte) || pte_protnone(pte) || !pte_special(pte) ||
	    !ng_user_traced(PFN_PHYS(pte_pfn(pte))))
		return false;
	for (tries = 0; tries < 8; tries++) {
		if (ng_user_swap(ptep, pte, ng_user_arm_entry(pte)))
			return true;
		pte = ptep_get(ptep);
		if (!pte_present(pte) || pte_protnone(pte) || !pte_special(pte))
			return false;
	}
	return false;
}

/* Arm the entries of [start, end) in vma that map traced pages; how many.  The mmap_lock held. */
static unsigned long ng_user_arm_range(struct vm_area_struct *vma, unsigned long start,
				       unsigned long end)
{
	unsigned long addr, n = 0;
	pte_t *ptep;

	for (addr = start; addr < end; addr += PAGE_SIZE) {
		ptep = ng_user_pte(vma->vm_mm, addr);
		if (!ptep) {
			addr = ng_user_next_pmd(addr) - PAGE_SIZE;
			continue;
		}
		n += ng_user_arm_pte(ptep);
	}
	return n;
}

/* Make every entry of vma armed here present again; the mmap_lock held. */
static void ng_user_disarm_vma(struct vm_area_struct *vma)
{
	unsigned long addr;
	pte_t *ptep, pte;

	for (addr = vma->vm_start; addr < vma->vm_end; addr += PAGE_SIZE) {
		ptep = ng_user_pte(vma->vm_mm, addr);
		if (!ptep) {
			addr = ng_user_next_pmd(addr) - PAGE_SIZE;
			continue;
		}
		pte = ptep_get(ptep);
		if (ng_user_armed(pte))
			ng_user_swap(ptep, pte, ng_user_disarm_entry(pte));
		if (!(addr & (PMD_SIZE - 1)))
			cond_resched();
	}
}

/* ---- the fault -------------------------------------------------------- */

/*
 * The mapping an emulated access goes through: the faulting page of the
 * VMA (virt and phys the VMA's start, for the record), its one page's
 * entry as the window shows it.  Per CPU, level 0, interrupts off.
 */
#define NG_USER_MAP_BYTES	(sizeof(struct ng_mapping) + sizeof(struct ng_page))

static struct ng_mapping __percpu *ng_user_fault_maps;

/* whether the hook and the probe are in place (ng_user_init) */
static bool ng_user_ready;

/*
 * The entry the window shows the page of the armed pte through: the user
 * entry as it was (the frame, the memory type, writable or not), made a
 * kernel one.
 */
static pteval_t ng_user_window_entry(pte_t pte, bool write)
{
	pteval_t v = pte_val(ng_user_disarm_entry(pte)) & ~(pteval_t)(_PAGE_USER | _PAGE_PKEY_MASK);

	if (!write)
		v &= ~(pteval_t)_PAGE_RW;
	return v | (_PAGE_NX & __supported_pte_mask);
}

/* Say that the page at addr is no longer traced (err: why). */
static void ng_user_untraced(unsigned long addr, pte_t pte, int err)
{
	struct mmiotng_map ev = {
		.virt = addr & PAGE_MASK, .phys = PFN_PHYS(pte_pfn(pte)), .size = PAGE_SIZE,
		.err = err, .pid = task_tgid_nr(current),
	};

	ng_report_unarmed(&ev, ng_level());
}

/* A fault on an armed entry of a user mapping: true if the access was emulated. */
static bool ng_user_fault(struct vm_area_struct *vma, unsigned long addr, unsigned int flags,
			  struct pt_regs *regs)
{
	struct ng_mapping *m;
	unsigned long irqs, page = addr & PAGE_MASK;
	struct ng_filter *f;
	pte_t *ptep, pte;
	bool done = false, write;

	if (!ng_user_vma(vma))
		return false;
	ptep = ng_user_pte(vma->vm_mm, addr);
	if (!ptep)
		return false;
	pte = ptep_get(ptep);
	if (!ng_user_armed(pte))
		return false;
	/* another process (a fork's child): its entry is made present, untraced, unsaid */
	if (!ng_user_wanted(current))
		return false;
	if (!(flags & FAULT_FLAG_USER) || !regs || !user_mode(regs) || !user_64bit_mode(regs)) {
		ng_user_untraced(addr, pte, -MMIOTNG_ERR_USER_KERNEL);
		return false;
	}
	/*
	 * Not emulated: an instruction fetch from the BAR, an entry of
	 * another privilege or protection key (the CPU would judge it), a
	 * task being single-stepped (uprobes, ptrace: the step must see the
	 * instruction run).
	 */
	if ((flags & FAULT_FLAG_INSTRUCTION) || !(pte_val(pte) & _PAGE_USER) ||
	    (pte_val(pte) & _PAGE_PKEY_MASK) || (regs->flags & X86_EFLAGS_TF)) {
		ng_user_untraced(addr, pte, -MMIOTNG_ERR_USER_INSN);
		return false;
	}
	/*
	 * Writes go through only where the process may write: a read-modify-
	 * write instruction may fault as a read, before its write.
	 */
	write = pte_write(pte);
	rcu_read_lock();
	/*
	 * The session and its process filter again, under RCU: the hook runs
	 * preemptible, and ng_user_stop() empties the filter (all processes)
	 * after the grace period that follows ng_user_on's clearing.
	 */
	if (!smp_load_acquire(&ng_user_on) || !ng_user_wanted(current)) {
		rcu_read_unlock();
		return false;
	}
	local_irq_save(irqs);
	/*
	 * The entry again, interrupts off: an unmap that cleared it (a
	 * driver revoking the BAR) has finished its TLB shootdown before now,
	 * or waits for this CPU to take its IPI after the access.
	 */
	if (!pte_same(ptep_get(ptep), pte)) {
		local_irq_restore(irqs);
		rcu_read_unlock();
		return false;
	}
	ng_lock_irqs_off();
	f = ng_find_filter(PFN_PHYS(pte_pfn(pte)) + (addr & ~PAGE_MASK), 1);
	ng_unlock_irqs_off();
	if (f) {
		m = this_cpu_ptr(ng_user_fault_maps);
		m->filter = f;
		m->virt = vma->vm_start;
		m->phys = PFN_PHYS(pte_pfn(pte)) - (page - vma->vm_start);
		m->size = vma->vm_end - vma->vm_start;
		m->base = page;
		m->len = PAGE_SIZE;
		m->live = true;
		m->user = true;
		m->user_write = write;
		m->page_shift = PAGE_SHIFT;
		m->npages = 1;
		m->pages[0].addr = page;
		m->pages[0].level = PG_LEVEL_4K;
		m->pages[0].saved = ng_user_window_entry(pte, write);
		m->pages[0].armed = true;
		done = ng_fault_user_map(regs, m, addr);
	}
	local_irq_restore(irqs);
	rcu_read_unlock();
	if (f && !done)
		ng_user_untraced(addr, pte, -MMIOTNG_ERR_USER_INSN);
	return done;
}

/* Runs in place of handle_mm_fault() for an access that was emulated. */
static noinline vm_fault_t ng_user_done(struct vm_area_struct *vma, unsigned long address,
					unsigned int flags, struct pt_regs *regs)
{
	barrier();
	return 0;
}

static void notrace ng_user_ftrace(unsigned long ip, unsigned long parent_ip,
				   struct ftrace_ops *op, struct ftrace_regs *fregs)
{
	struct pt_regs *kregs = ftrace_get_regs(fregs);
	struct vm_area_struct *vma;

	if (!kregs)
		return;
	vma = (struct vm_area_struct *)regs_get_kernel_argument(kregs, 0);
	/* acquire: the process filter ng_user_start() wrote before it */
	if (likely(!(vma->vm_flags & VM_PFNMAP)) || !smp_load_acquire(&ng_user_on))
		return;
	if (ng_user_fault(vma, regs_get_kernel_argument(kregs, 1),
			  regs_get_kernel_argument(kregs, 2),
			  (struct pt_regs *)regs_get_kernel_argument(kregs, 3)))
		instruction_pointer_set(kregs, (unsigned long)ng_user_done);
}

static struct ftrace_ops ng_user_ops = {
	.func = ng_user_ftrace,
	.flags = FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_IPMODIFY,
};

/* ---- new mappings: remap_pfn_range() -------------------------------- */

struct ng_remap_args {
	struct vm_area_struct *vma;
	unsigned long addr;
	unsigned long size;
};

static int ng_user_remap_entry(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct ng_remap_args *a = (struct ng_remap_args *)ri->data;

	a->vma = (struct vm_area_struct *)regs_get_kernel_argument(regs, 0);
	a->addr = regs_get_kernel_argument(regs, 1);
	a->size = regs_get_kernel_argument(regs, 3);
	return 0;
}

/*
 * A mapping made into the caller's own mm (mmap, or a driver's fault
 * handler): armed now, its entries having been present for an instant.
 * No TLB flush: no access through them can have happened yet, but this
 * CPU's (a speculative walk may have loaded one), which is dropped.
 */
static int ng_user_remap_ret(struct kretprobe_instance *ri, struct pt_regs *regs)
{
	struct ng_remap_args *a = (struct ng_remap_args *)ri->data;
	struct vm_area_struct *vma = a->vma;
	unsigned long n;

	/* acquire: the process filter, as in ng_user_ftrace() */
	if (regs_return_value(regs) || !smp_load_acquire(&ng_user_on) ||
	    vma->vm_mm != current->mm || !ng_user_wanted(current) || !ng_user_vma(vma) ||
	    a->addr < vma->vm_start || a->addr >= vma->vm_end || a->size > vma->vm_end - a->addr)
		return 0;
	n = ng_user_arm_range(vma, a->addr, a->addr + a->size);
	if (n)
		ng_flush_tlb_local();
	return 0;
}

static struct kretprobe ng_user_remap_probe = {
	.kp.symbol_name = "remap_pfn_range",
	.entry_handler = ng_user_remap_entry,
	.handler = ng_user_remap_ret,
	.data_size = sizeof(struct ng_remap_args),
	.maxactive = 64,
};

/* ---- the session's commands ----------------------------------------- */

/* The filter emptied, its references put; ng_mutex held, no reader left. */
static void ng_user_filter_clear(void)
{
	unsigned int i;

	for (i = 0; i < ng_user_npids; i++)
		put_pid(ng_user_pids[i]);
	WRITE_ONCE(ng_user_npids, 0);
	WRITE_ONCE(ng_user_ncomms, 0);
}

/*
 * TRACE_USER: arm the user mappings of traced pages from now on, of the
 * processes pids (as the caller sees them) and those named comms
 * (MMIOTNG_COMM_LEN bytes each) only, if any is given.  ng_mutex held.
 */
int ng_user_start(const u32 *pids, unsigned int npids, const char *comms, unsigned int ncomms)
{
	unsigned int i;

	lockdep_assert_held(&ng_mutex);
	if (!IS_ENABLED(CONFIG_NUMA_BALANCING))
		return -EOPNOTSUPP;
	if (!ng_user_ready)
		return -ENODEV;
	if (READ_ONCE(ng_user_on))
		return -EBUSY;
	if (npids > MMIOTNG_USER_MAX_PIDS || ncomms > MMIOTNG_USER_MAX_COMMS)
		return -EINVAL;
	for (i = 0; i < npids; i++) {
		struct pid *pid = find_get_pid(pids[i]);

		if (!pid || !pid_has_task(pid, PIDTYPE_TGID)) {
			put_pid(pid);
			ng_user_filter_clear();
			return -ESRCH;
		}
		ng_user_pids[i] = pid;
		WRITE_ONCE(ng_user_npids, i + 1);
	}
	for (i = 0; i < ncomms; i++)
		strscpy_pad(ng_user_comms[i], comms + i * MMIOTNG_COMM_LEN,
			    min_t(size_t, TASK_COMM_LEN, MMIOTNG_COMM_LEN));
	WRITE_ONCE(ng_user_ncomms, ncomms);
	/* the filter is seen by whoever sees this */
	smp_store_release(&ng_user_on, true);
	return 0;
}

/*
 * ARM_USER: arm process pid's mapping [virt, virt + size) (made before the
 * start).  ng_mutex held.
 */
int ng_user_arm(pid_t pid, unsigned long virt, unsigned long size)
{
	struct vm_area_struct *vma;
	struct task_struct *task;
	struct mm_struct *mm;
	unsigned long n = 0;
	int ret = 0;

	lockdep_assert_held(&ng_mutex);
	if (!READ_ONCE(ng_user_on))
		return -EPERM;
	rcu_read_lock();
	task = pid_task(find_vpid(pid), PIDTYPE_TGID);
	if (task)
		get_task_struct(task);
	rcu_read_unlock();
	if (!task)
		return -ESRCH;
	if (!ng_user_wanted(task)) {
		put_task_struct(task);
		return -ENOENT;
	}
	size += virt & ~PAGE_MASK;
	virt &= PAGE_MASK;
	mm = get_task_mm(task);
	put_task_struct(task);
	if (!mm)
		return -ESRCH;
	if (mmap_read_lock_killable(mm)) {
		mmput(mm);
		return -EINTR;
	}
	vma = find_vma(mm, virt);
	if (!vma || vma->vm_start > virt || size > vma->vm_end - virt || !ng_user_vma(vma))
		ret = -EINVAL;
	else
		n = ng_user_arm_range(vma, virt, virt + size);
	mmap_read_unlock(mm);
	mmput(mm);
	if (n)
		ng_flush_all();
	else if (!ret)
		ret = -ENODATA;		/* none of its pages is there now */
	return ret;
}

/* The mm of a thread group (its leader may have exited before the others); RCU held. */
static struct mm_struct *ng_user_task_mm(struct task_struct *leader)
{
	struct task_struct *t;
	struct mm_struct *mm;

	for_each_thread(leader, t) {
		mm = get_task_mm(t);
		if (mm)
			return mm;
	}
	return NULL;
}

/* Disarm every armed entry of mm; false if its mmap_lock could not be had. */
static bool ng_user_disarm_mm(struct mm_struct *mm)
{
	struct vm_area_struct *vma;
	int tries;

	for (tries = 0; !mmap_read_trylock(mm); tries++) {
		if (tries == 100)
			return false;
		usleep_range(1000, 2000);
	}
	{
		VMA_ITERATOR(vmi, mm, 0);

		for_each_vma(vmi, vma)
			if (ng_user_vma(vma))
				ng_user_disarm_vma(vma);
	}
	mmap_read_unlock(mm);
	return true;
}

/*
 * The session ends: nothing is armed from now on, and every process's
 * armed entries (forks' copies too) are made present.  ng_mutex held.
 */
void ng_user_stop(void)
{
	struct task_struct *task;
	struct mm_struct *mm;
	unsigned int left = 0;
	struct pid *pid;
	int nr = 1;

	lockdep_assert_held(&ng_mutex);
	if (!READ_ONCE(ng_user_on))
		return;
	WRITE_ONCE(ng_user_on, false);
	/* no arming after this: the probe and the hook read ng_user_on once */
	synchronize_rcu();
	ng_user_filter_clear();
	for (;;) {
		rcu_read_lock();
		pid = find_ge_pid(nr, &init_pid_ns);
		if (!pid) {
			rcu_read_unlock();
			break;
		}
		nr = pid_nr(pid) + 1;
		task = pid_task(pid, PIDTYPE_TGID);
		mm = task ? ng_user_task_mm(task) : NULL;
		rcu_read_unlock();
		if (!mm)
			continue;
		left += !ng_user_disarm_mm(mm);
		mmput(mm);
		cond_resched();
	}
	if (left)
		pr_info("%u processes held their mmap lock too long: their armed pages of user mappings are made present at their next access\n",
			left);
}

/*
 * The hook and the probe, for the module's life (changing kernel text per
 * session would cost every page fault's path a patch each time).  Their
 * failure is not the module's: user mappings are then not traced, and
 * TRACE_USER says why.
 */
void ng_user_init(void)
{
	int ret;

	if (!IS_ENABLED(CONFIG_NUMA_BALANCING))
		return;
	ng_user_fault_maps = __alloc_percpu(NG_USER_MAP_BYTES, __alignof__(struct ng_mapping));
	if (!ng_user_fault_maps)
		return;
	ret = register_kretprobe(&ng_user_remap_probe);
	if (ret) {
		pr_warn("cannot probe remap_pfn_range (%d): user mappings are not traced\n", ret);
		goto err_maps;
	}
	ret = ng_ftrace_hook(&ng_user_ops, "handle_mm_fault");
	if (ret)
		goto err_probe;
	ng_user_ready = true;
	return;

err_probe:
	unregister_kretprobe(&ng_user_remap_probe);
err_maps:
	free_percpu(ng_user_fault_maps);
}

/* After the session ended (ng_user_stop): nothing is armed any more. */
void ng_user_exit(void)
{
	if (!ng_user_ready)
		return;
	unregister_kretprobe(&ng_user_remap_probe);
	ng_ftrace_unhook(&ng_user_ops);
	/* a task the hook sent to ng_user_done() may still be in it */
	synchronize_rcu_tasks();
	free_percpu(ng_user_fault_maps);
}
