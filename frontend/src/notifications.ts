import { useEffect, useState } from 'react'
import { LiveStream } from './live/LiveStream'
import type { StreamEvent, User } from './types'

/**
 * Browser notifications: while they are on (this browser's choice, kept in localStorage, and the
 * permission the browser granted on a click), a Notification appears when a job of the signed-in
 * user ends or is queued to wait, as the queue's stream tells it.
 */
export type BrowserNotificationState = 'unsupported' | 'denied' | 'off' | 'on'

export const BROWSER_NOTIFICATIONS_KEY = 'lanner.browserNotifications'
/** Fired on window when this browser's choice changes, so that the listener starts or stops. */
export const BROWSER_NOTIFICATIONS_EVENT = 'lanner:browser-notifications'

function announce() {
  if (typeof window !== 'undefined') window.dispatchEvent(new Event(BROWSER_NOTIFICATIONS_EVENT))
}

/** What these functions use of `window` (injected in tests). */
export interface NotificationHost {
  Notification?: { permission: NotificationPermission; requestPermission(): Promise<NotificationPermission> }
  localStorage: Pick<Storage, 'getItem' | 'setItem' | 'removeItem'>
}

export function browserNotificationState(host: NotificationHost = window): BrowserNotificationState {
  if (!host.Notification) return 'unsupported'
  if (host.Notification.permission === 'denied') return 'denied'
  return host.Notification.permission === 'granted' && host.localStorage.getItem(BROWSER_NOTIFICATIONS_KEY) === 'on'
    ? 'on'
    : 'off'
}

/** Asks the browser's permission (call it from a click: browsers ignore requests made otherwise). */
export async function turnOnBrowserNotifications(host: NotificationHost = window): Promise<BrowserNotificationState> {
  if (!host.Notification) return 'unsupported'
  const permission = await host.Notification.requestPermission()
  if (permission === 'granted') host.localStorage.setItem(BROWSER_NOTIFICATIONS_KEY, 'on')
  announce()
  return browserNotificationState(host)
}

export function turnOffBrowserNotifications(host: NotificationHost = window): BrowserNotificationState {
  host.localStorage.removeItem(BROWSER_NOTIFICATIONS_KEY)
  announce()
  return browserNotificationState(host)
}

export interface JobNotice {
  title: string
  body: string
  /** One notification per job: a later one replaces it. */
  tag: string
  /** The job's page. */
  path: string
}

const ENDINGS: Record<string, string> = { succeeded: 'finished', failed: 'failed', cancelled: 'was cancelled' }

/**
 * The notice of a queue event when it is the end of one of `userId`'s jobs, or one of them queued
 * with the reason it waits (an `added` event's `waiting`: set once per job, and once per sweep);
 * null otherwise.
 */
export function jobNotice(event: { type: string; data: unknown }, userId: number): JobNotice | null {
  const data = (event.data ?? {}) as Record<string, unknown>
  if (event.type === 'added') {
    if (data.owner_id !== userId || typeof data.job_id !== 'number' || typeof data.waiting !== 'string' || !data.waiting) return null
    const name = typeof data.name === 'string' && data.name ? data.name : `Job #${data.job_id}`
    return { title: `${name} is waiting`, body: data.waiting, tag: `lanner-job-${data.job_id}`, path: `/jobs/${data.job_id}` }
  }
  if (event.type !== 'finished' && event.type !== 'cancelled') return null
  const status = event.type === 'cancelled' ? 'cancelled' : String(data.status)
  if (data.owner_id !== userId || !(status in ENDINGS) || typeof data.job_id !== 'number') return null
  const name = typeof data.name === 'string' && data.name ? data.name : `Job #${data.job_id}`
  const error = typeof data.error === 'string' && data.error ? data.error : null
  return {
    title: `${name} ${ENDINGS[status]}`,
    body: error ?? `Job #${data.job_id} ${status}.`,
    tag: `lanner-job-${data.job_id}`,
    path: `/jobs/${data.job_id}`,
  }
}

/** Shows a Notification for each of the user's jobs that ends or waits, while browser notifications are on. */
export function useJobNotifications(user: User | null, open: (path: string) => void): void {
  const userId = user?.id ?? null
  const [on, setOn] = useState(() => browserNotificationState() === 'on')
  useEffect(() => {
    const recheck = () => setOn(browserNotificationState() === 'on')
    window.addEventListener(BROWSER_NOTIFICATIONS_EVENT, recheck)
    return () => window.removeEventListener(BROWSER_NOTIFICATIONS_EVENT, recheck)
  }, [])
  useEffect(() => {
    if (userId === null || !on) return
    const stream = new LiveStream({
      path: '/ws/queue',
      after: '$',
      onEvents: (events: StreamEvent[]) => {
        for (const event of events as { type: string; data: unknown }[]) {
          const notice = jobNotice(event, userId)
          if (!notice) continue
          const shown = new Notification(notice.title, { body: notice.body, tag: notice.tag })
          shown.onclick = () => {
            window.focus()
            open(notice.path)
          }
        }
      },
    })
    return () => stream.close()
  }, [userId, on, open])
}
