import { render, screen, within } from '@testing-library/react'
import { describe, expect, it } from 'vitest'
import { healthFixture } from '../test/fixtures'
import { HardwarePanel } from './HardwarePanel'

describe('HardwarePanel', () => {
  it('lists each worker with its device and memory in GiB', () => {
    render(<HardwarePanel state={{ health: healthFixture(), error: null, checkedAt: Date.now() }} />)
    const panel = screen.getByTestId('workers')
    const rows = within(panel).getAllByRole('row').slice(1)
    expect(rows).toHaveLength(2)
    expect(rows[0]).toHaveTextContent('gpu0@box')
    expect(rows[0]).toHaveTextContent('cuda:0 · NVIDIA H200')
    expect(rows[0]).toHaveTextContent('141.0 GiB')
    expect(rows[1]).toHaveTextContent('cpu · x86_64')
    expect(rows[1]).toHaveTextContent('24.0 GiB')
  })

  it('says so when no worker is connected', () => {
    render(<HardwarePanel state={{ health: healthFixture({ workers: [] }), error: null, checkedAt: 0 }} />)
    expect(screen.getByTestId('workers')).toHaveTextContent('No workers connected')
  })
})
